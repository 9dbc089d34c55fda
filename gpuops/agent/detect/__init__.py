"""Quiet failures: GPU samples and throughput figures in, findings out (detectors over episodes), the sample
store (telemetry), the run's profile and baseline, the inductor cache watched, the compute processes per GPU.

Target side; the client reads `telemetry` samples for status' sparkline.
"""
