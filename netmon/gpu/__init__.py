"""The GPUs as NVML and the kubelet see them: thin NVML reads (nvml, nvml_links), the idle decision
over its readings (idle, idle_reading), the kubelet's pod-resources answer (podresources, kubelet)
and PCIe and NVLink health (linkhealth). Nothing here creates a CUDA context."""
