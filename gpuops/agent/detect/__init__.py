"""Quiet failures: GPU samples and throughput figures in, findings out. One module per detector (named by its
entry in wire/detector_list.py: throughput_drop, gpu_memory, compile_after_warmup), each a `Detector` of
judge.py, run together by detectors.py over episodes; what the watchdog measures for them (quiet_failures),
the sample store (telemetry), the run's profile and baseline, the inductor cache watched, the compute
processes per GPU.

Target side only: status reads the samples through the wire (wire/samples.py).
"""
