"""GPU and model descriptions that fitted profiles are built on, each value with its source.

``coda profile fit`` needs the hardware a measurement ran on (SMs, bandwidth, shared memory)
and the model's attention shape; measured CSVs named like LLMServingSim's
(``<GPU>_<model>_tp<N>_<kind>.csv``) select them by name.
"""

from __future__ import annotations

from typing import Any

#: GPU-to-GPU links and the measured cost of the collectives vLLM runs on them (``coda.cost.parallel``):
#: ``floor_s + bus bytes / bus_bw_bytes_s`` per call, each constant from a published measurement
#: (nccl-tests' all_reduce_perf or a collective benchmark), a datasheet or NCCL's own model, as
#: its provenance says. Provenance keys are relative to ``gpu.link``.
#: provenance shared by several links
VLLM_MAX_BYTES = "vLLM source: CustomAllreduce max_size, 8 MiB"
NVLINK_P2P = "datasheet: NVLink-connected GPUs have peer access"
NCCL_MODEL_FLOOR = "NCCL's tuning model (src/graph/tuning.cc): ring LL base 3.6 us + 2 NVLink hops of 0.47 us, not a measurement"
def _nvlink(generation: str, datasheet_bw: float, datasheet: str, nccl_bw: tuple[float, str], custom_floor: tuple[float, str],
            custom_bw: tuple[float, str]) -> dict[str, Any]:
    """An NVLink generation's entry: peer access, NCCL's modelled floor, each other constant with its source."""
    return {
        "spec": {"kind": "nvlink", "generation": generation, "bus_bw_bytes_s": datasheet_bw, "p2p": True,
                 "nccl": {"floor_s": 4.5e-6, "bus_bw_bytes_s": nccl_bw[0]},
                 "custom_allreduce": {"floor_s": custom_floor[0], "bus_bw_bytes_s": custom_bw[0]}},
        "provenance": {"bus_bw_bytes_s": f"datasheet: {generation.split(' (')[0]}, {datasheet}", "p2p": NVLINK_P2P,
                       "nccl.floor_s": NCCL_MODEL_FLOOR, "nccl.bus_bw_bytes_s": nccl_bw[1], "custom_allreduce.floor_s": custom_floor[1],
                       "custom_allreduce.bus_bw_bytes_s": custom_bw[1], "custom_max_bytes": VLLM_MAX_BYTES},
    }


LINKS: dict[str, dict[str, Any]] = {
    "pcie-gen4-no-p2p": {
        "spec": {
            "kind": "pcie",
            "generation": "PCIe Gen4 x16, no peer access",
            "bus_bw_bytes_s": 3.2e10,
            "p2p": False,
            "nccl": {"floor_s": 14.9e-6, "bus_bw_bytes_s": 12.8e9},
            "custom_allreduce": None,
        },
        "provenance": {
            "bus_bw_bytes_s": "datasheet: PCIe Gen4 x16, 32 GB/s per direction (no NVLink)",
            "p2p": "vendor: GeForce RTX 40 cards have no peer access under NVIDIA's driver, "
            "so vLLM's custom all-reduce is disabled and NCCL runs",
            "nccl.floor_s": (
                "measured by others: all_reduce_perf on 4 RTX 4090, PCIe Gen4 (github.com/tinygrad/open-gpu-kernel-modules pull 22): "
                "32 KiB in 18.8 us, less its bus bytes at the bandwidth below; measured with a peer-access driver, no published "
                "2-GPU table without it was found"
            ),
            "nccl.bus_bw_bytes_s": "measured by others: the same run, bus bandwidth 12.6-12.8 GB/s from 8 MiB to 64 MiB",
            "custom_max_bytes": VLLM_MAX_BYTES + " (unused without peer access)",
        },
    },
    "pcie-gen5-p2p": {
        "spec": {
            "kind": "pcie",
            "generation": "PCIe Gen5 x16, peer access",
            "bus_bw_bytes_s": 6.4e10,
            "p2p": True,
            "nccl": {"floor_s": 8.3e-6, "bus_bw_bytes_s": 17.7e9},
            "custom_allreduce": {"floor_s": 4.1e-6, "bus_bw_bytes_s": 52e9},
        },
        "provenance": {
            "bus_bw_bytes_s": "datasheet: PCIe Gen5 x16, 64 GB/s per direction (no NVLink)",
            "p2p": "measured by others: peer reads between RTX PRO 6000 Blackwell GPUs (github.com/local-inference-lab/b12x pull 139; "
            "github.com/vllm-project/vllm/issues/56128: 4x RTX PRO 6000 Server Edition, PCIe peer-to-peer)",
            "nccl.floor_s": (
                "measured by others: NCCL baseline of github.com/flashinfer-ai/flashinfer pull 5023 on SM120 PCIe hosts (RTX PRO "
                "6000 class), TP 2 table: 8.31 us for one BF16 row of 4,096 (8 KiB)"
            ),
            "nccl.bus_bw_bytes_s": (
                "measured by others: the same table, 32,768 rows (256 MiB gathered) in 7.60 ms: 35.3 GB/s algorithm "
                "bandwidth, bus bandwidth (n - 1) / n of it at n = 2"
            ),
            "custom_allreduce.floor_s": (
                "measured by others: a CUDA-IPC collective synchronised by system-scope flags, as vLLM's custom "
                "all-reduce is, on the same hosts (flashinfer pull 5023): 4.08 us at one row"
            ),
            "custom_allreduce.bus_bw_bytes_s": (
                "measured by others: about 52 GB/s peer reads on RTX PRO 6000 PCIe (b12x pull 139); vLLM's "
                "one-shot all-reduce at 2 GPUs reads the peer's whole message"
            ),
            "custom_max_bytes": VLLM_MAX_BYTES,
        },
    },
    "nvlink3": _nvlink(
        "NVLink 3 (A100 SXM4)",
        3.0e11,
        "600 GB/s total, 300 GB/s per direction",
        (2.35e11, "NCCL's tuning model (src/graph/tuning.cc) caps an A100's bus bandwidth at 235 GB/s, not a measurement"),
        (
            8.7e-6,
            "assumed: the NVLink 4 measurement of vLLM's custom all-reduce on H100 (sglang pull 2904): launch and flag "
            "synchronisation, not the link's bandwidth",
        ),
        (
            38e9,
            "derived: the NVLink 4 measurement (57 GB/s, sglang pull 2904) scaled by the datasheets' per-direction bandwidth (300 / 450)",
        ),
    ),
    "nvlink4": _nvlink(
        "NVLink 4 (H100 / H200 SXM)",
        4.5e11,
        "900 GB/s total, 450 GB/s per direction",
        (3.6e11, "assumed: 80% of the datasheet's per-direction bandwidth (vLLM runs NCCL only above 8 MiB here)"),
        (
            8.7e-6,
            "measured by others: vLLM's custom all-reduce on H100 at TP 2, eager mode (github.com/sgl-project/sglang pull 2904): "
            "8.7 us at 32 KiB",
        ),
        (57e9, "measured by others: the same table, 26.6 us at 1 MiB: 57 GB/s between 32 KiB and 1 MiB"),
    ),
}


def link_entry(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A link's ``gpu.link`` section and its provenance under ``gpu.link.``."""
    entry = LINKS[name]
    return entry["spec"], {f"gpu.link.{k}": v for k, v in entry["provenance"].items()}


GPUS: dict[str, dict[str, Any]] = {
    "RTX4090": {
        "spec": {
            "name": "NVIDIA GeForce RTX 4090",
            "hbm_bw_bytes_s": 1.008e12,
            "peak_flops": 1.652e14,
            "num_sms": 128,
            "mem_efficiency": 0.8,
            "compute_efficiency": 0.4,
            "attn_compute_efficiency": 0.5,
            "memory_bytes": 24e9,
            "link": "pcie-gen4-no-p2p",
        },
        "smem_per_sm_bytes": 100 * 1024,
        "provenance": {
            "gpu.hbm_bw_bytes_s": "datasheet: RTX 4090, 1,008 GB/s GDDR6X",
            "gpu.peak_flops": "datasheet: Ada whitepaper, 165.2 TFLOP/s dense FP16/BF16 tensor (FP16 accumulate)",
            "gpu.num_sms": "datasheet: AD102 in RTX 4090, 128 SMs",
            "gpu.memory_bytes": "datasheet: RTX 4090, 24 GB GDDR6X",
            "gpu.mem_efficiency": "assumed: 80% of peak bandwidth for weight streaming (dense part)",
            "gpu.compute_efficiency": "assumed: 40% of peak in GEMMs",
            "gpu.attn_compute_efficiency": "assumed: 50% of peak in prefill attention",
        },
    },
    "RTXPRO6000": {
        "spec": {
            "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "hbm_bw_bytes_s": 1.597e12,
            "peak_flops": 5.0e14,
            "num_sms": 188,
            "mem_efficiency": 0.8,
            "compute_efficiency": 0.4,
            "attn_compute_efficiency": 0.5,
            "memory_bytes": 96e9,
            "link": "pcie-gen5-p2p",
        },
        "smem_per_sm_bytes": 100 * 1024,
        "provenance": {
            "gpu.hbm_bw_bytes_s": "datasheet: RTX PRO 6000 Blackwell Server Edition, 1,597 GB/s GDDR7 "
            "(the measured card, per its meta.yaml; the Workstation Edition has 1,792 GB/s)",
            "gpu.peak_flops": "derived: datasheet 4,000 sparse FP4 TOPS halved per precision step, ~500 TFLOP/s dense BF16 "
            "(the Workstation Edition's figure; the Server Edition's clocks may be lower)",
            "gpu.num_sms": "datasheet: 24,064 CUDA cores / 128 per SM = 188 SMs",
            "gpu.memory_bytes": "datasheet: RTX PRO 6000 Blackwell, 96 GB GDDR7",
            "gpu.mem_efficiency": "assumed: 80% of peak bandwidth for weight streaming (dense part)",
            "gpu.compute_efficiency": "assumed: 40% of peak in GEMMs",
            "gpu.attn_compute_efficiency": "assumed: 50% of peak in prefill attention",
        },
    },
    "A100": {
        "spec": {
            "name": "NVIDIA A100-SXM4-80GB",
            "hbm_bw_bytes_s": 2.039e12,
            "peak_flops": 3.12e14,
            "num_sms": 108,
            "mem_efficiency": 0.8,
            "compute_efficiency": 0.4,
            "attn_compute_efficiency": 0.5,
            "memory_bytes": 80e9,
            "link": "nvlink3",
        },
        "smem_per_sm_bytes": 164 * 1024,
        "provenance": {
            "gpu.hbm_bw_bytes_s": "datasheet: NVIDIA A100 80GB SXM, 2,039 GB/s HBM2e",
            "gpu.peak_flops": "datasheet: NVIDIA A100, 312 TFLOP/s dense BF16 tensor",
            "gpu.num_sms": "datasheet: NVIDIA A100, 108 SMs",
            "gpu.memory_bytes": "datasheet: NVIDIA A100 80GB",
            "gpu.mem_efficiency": "assumed: ~80% of peak HBM bandwidth for streaming kernels",
            "gpu.compute_efficiency": "assumed: 40% of peak in GEMMs",
            "gpu.attn_compute_efficiency": "assumed: 50% of peak in prefill attention",
        },
    },
    "H200": {
        "spec": {
            "name": "NVIDIA H200",
            "hbm_bw_bytes_s": 4.8e12,
            "peak_flops": 9.89e14,
            "num_sms": 132,
            "mem_efficiency": 0.8,
            "compute_efficiency": 0.4,
            "attn_compute_efficiency": 0.5,
            "memory_bytes": 141e9,
            "link": "nvlink4",
        },
        "smem_per_sm_bytes": 228 * 1024,
        "provenance": {
            "gpu.hbm_bw_bytes_s": "datasheet: H200 SXM, 4.8 TB/s HBM3e",
            "gpu.peak_flops": "datasheet: H200 SXM, 989 TFLOP/s dense BF16 tensor",
            "gpu.num_sms": "datasheet: H100/H200 SXM, 132 SMs",
            "gpu.memory_bytes": "datasheet: H200, 141 GB HBM3e",
            "gpu.mem_efficiency": "assumed: ~80% of peak HBM bandwidth for streaming kernels",
            "gpu.compute_efficiency": "assumed: 40% of peak in GEMMs",
            "gpu.attn_compute_efficiency": "assumed: 50% of peak in prefill attention",
        },
    },
}


def _attach_links() -> None:
    """Each GPU names its link in LINKS; its entry gets the link's section and provenance."""
    for gpu in GPUS.values():
        spec, prov = link_entry(gpu["spec"]["link"])
        gpu["spec"]["link"] = spec
        gpu["provenance"].update(prov)


_attach_links()

MODELS: dict[str, dict[str, Any]] = {
    "Qwen3-Coder-30B-A3B-Instruct-FP8": {
        "spec": {
            "name": "Qwen3-Coder-30B-A3B-Instruct-FP8",
            "num_layers": 48,
            "num_q_heads": 32,
            "num_kv_heads": 4,
            "head_dim": 128,
            "kv_dtype_bytes": 2,
            "active_params": 3.3e9,
            "dense_weight_bytes": 1.54e9,
            "num_experts": 128,
            "experts_per_token": 8,
            "expert_bytes": 4718592,
        },
        "provenance": {
            "model.num_layers": "model card: Qwen3-Coder-30B-A3B, 48 layers",
            "model.num_q_heads": "model card: 32 query heads",
            "model.num_kv_heads": "model card: 4 KV heads (GQA)",
            "model.head_dim": "model card: head_dim 128",
            "model.kv_dtype_bytes": "paper setup: bf16 KV cache (2 bytes), 96 KiB per token",
            "model.active_params": "model card: 3.3B activated parameters",
            "model.dense_weight_bytes": "derived from the model config: attention 48 x 18.9M + router 48 x 262K params "
            "at 1 B (FP8) + bf16 lm_head 151,936 x 2,048",
            "model.num_experts": "model card: 128 experts",
            "model.experts_per_token": "model card: 8 activated experts",
            "model.expert_bytes": "derived: 3 x 2,048 x 768 FP8 params per expert per layer",
        },
    },
    "Llama-3.1-8B": {
        "spec": {
            "name": "Llama-3.1-8B",
            "num_layers": 32,
            "num_q_heads": 32,
            "num_kv_heads": 8,
            "head_dim": 128,
            "kv_dtype_bytes": 2,
            "active_params": 8.03e9,
            "dense_weight_bytes": 1.606e10,
            "num_experts": 0,
            "experts_per_token": 0,
            "expert_bytes": 0,
        },
        "provenance": {
            "model.num_layers": "model card: Llama-3.1-8B, 32 layers",
            "model.num_q_heads": "model card: 32 query heads",
            "model.num_kv_heads": "model card: 8 KV heads (GQA)",
            "model.head_dim": "model card: head_dim 128",
            "model.kv_dtype_bytes": "measurement setup: bf16 KV cache (vLLM default)",
            "model.active_params": "model card: 8.03B parameters",
            "model.dense_weight_bytes": "derived: 8.03B parameters in bf16, all read every step (dense model)",
            "model.num_experts": "model card: dense model",
            "model.experts_per_token": "model card: dense model",
            "model.expert_bytes": "model card: dense model",
        },
    },
}

# A CTA of FA2's split-KV decode kernel for head_dim 128: Q 64x128 + K, V 128x128 in bf16.
FA2_SPLIT_CTA_SMEM_BYTES = (64 * 128 + 2 * 128 * 128) * 2


def ctas_per_sm(gpu: str) -> int:
    """Resident split-KV CTAs per SM from shared memory (the FA2 heuristic assumes 2)."""
    return max(1, GPUS[gpu]["smem_per_sm_bytes"] // FA2_SPLIT_CTA_SMEM_BYTES)


def gpu_key(device_name: str) -> str | None:
    """Catalog key of a device name as CUDA reports it (``NVIDIA H200`` -> ``H200``)."""
    flat = device_name.upper().replace(" ", "").replace("-", "")
    for key, entry in GPUS.items():
        if key.upper().replace("-", "") in flat or entry["spec"]["name"].upper().replace(" ", "").replace("-", "") in flat:
            return key
    return None
