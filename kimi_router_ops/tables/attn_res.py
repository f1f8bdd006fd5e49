"""Kimi-K3's AttnRes producer (kernels/attn_res.py)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class AttnResKernel:
    """Kimi-K3's AttnRes producer (kernels/attn_res.py): one token over a cluster of
    `cluster` CTAs of `threads` threads, one 16-byte vector of the hidden size a thread (so
    H <= cluster * threads * 8), up to `max_blocks` block sources besides the prefix (a lane
    of the cross-CTA exchange holds one of the 2 * (max_blocks + 1) per-source sums)."""

    cluster: int = 8
    threads: int = 128
    max_blocks: int = 15

    @property
    def max_hidden(self) -> int:
        return self.cluster * self.threads * 8


ATTN_RES_KERNEL = AttnResKernel()
