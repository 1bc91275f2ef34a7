"""`make gpu-check` (python -m bench.gpu_check): discovery, the doctor, NVML telemetry, vLLM's GPU
build, serving through the gateway and KV-aware routing, checked on a real NVIDIA GPU in one
run, with the machine recorded as a test fixture (docs/gpu-check.md).

In bench/ because it reuses the KV routing benchmark's vLLM pieces (bench/kv_fleet.py) and
nothing may import bench/: a `llmgw gpu-check` in workers/ could not.
"""
