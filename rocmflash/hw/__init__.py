"""What the machine is: the GPU catalog, live-device detection, ROCm/CUDA differences, versions, peaks.

Imports nothing: import the submodule you need (keeps every import light)."""
