"""The RMSNorm producers (kernels/rms_norm.py)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class NormKernel:
    """A PDL-launched RMSNorm (kernels/rms_norm.py): `op` is rms_norm or fused_add_rms_norm;
    vec 8 (16-byte loads: K % 8 == 0, aligned rows) or 1 (any K, any alignment). One CTA of
    `threads` per row; a step loads `unroll` vectors per thread at once (8 x 128 x 8 = 8192
    elements: a 7168-wide row in one step). 512 threads of 2 vectors measured no faster
    behind a router and 0.3 us slower alone (docs/kernel-notes.md)."""

    op: str
    vec: int
    threads: int = 128
    unroll: int = 8


NORM_KERNELS = tuple(NormKernel(op, vec) for op in ("rms_norm", "fused_add_rms_norm") for vec in (8, 1))
