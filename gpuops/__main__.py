from gpuops.cli.main import main

main()
