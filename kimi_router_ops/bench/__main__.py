from .gemm import main

main()
