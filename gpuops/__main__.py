from gpuops.cli.entry import run

run()
