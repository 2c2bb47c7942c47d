"""The GPUs as NVML and the kubelet see them: thin NVML reads (nvml), the idle decision over its
readings (idle), the kubelet's pod-resources answer (podresources, kubelet) and PCIe and NVLink
health (linkhealth). Nothing here creates a CUDA context."""
