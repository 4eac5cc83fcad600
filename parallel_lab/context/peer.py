"""The peer: PyTorch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``),
and what of it runs on CPU ranks with gloo (``probe``).

    launcher.run(peer.probe, 2)[0]
    # {"default causal": {"ok": False, "why": "NotImplementedError: Operator
    #   aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy ..."},
    #  "math not-causal": {"ok": True, "max_diff": 2e-16, "collectives": {...all_gather_into_tensor...}}, ...}

Found with torch 2.13 (CPU build), 2 and 4 gloo ranks, fp32 and fp64: ``context_parallel`` patches
``F.scaled_dot_product_attention`` to run on DTensors sharded along the sequence, and sends the
CUDA kernels' ops (``_scaled_dot_product_flash/efficient/cudnn_attention``) to its ring attention.
On CPU, SDPA's kernel is ``aten._scaled_dot_product_flash_attention_for_cpu``, which it does not
route to the ring and for which DTensor has no sharding strategy: causal fails in the forward,
not causal in the backward (``..._for_cpu_backward``). Forcing SDPA's MATH kernel, causal fails
too (the causal mask is a plain tensor added to DTensor scores: "got mixed torch.Tensor and DTensor")
and not causal runs, but through DTensor's generic sharding rules, which all-gather K and V (and
reduce-scatter their gradients): not ring attention. So its ring attention does not run here; the
benchmark (``bench/context.py``) compares ours with the single-process attention's time per rank,
and with that all-gather path where it runs (not causal).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard
from torch.nn.attention import SDPBackend, sdpa_kernel

from parallel_lab.i18n import _l

KERNELS = {"default": None, "math": SDPBackend.MATH}
WHY_NOT = _l("torch 2.13's context_parallel does not run SDPA's CPU kernel (aten._scaled_dot_product_flash_"
           "attention_for_cpu has no ring handler and no DTensor sharding strategy), and with the MATH kernel "
           "only without a causal mask, as a DTensor all-gather of K and V, not its ring")


@contextmanager
def torch_context_parallel(mesh, tensors, kernel: str = "math"):
    """Inside the block, SDPA is PyTorch's context-parallel one over ``mesh``; yields this rank's
    shards of ``tensors`` (each ``(B, n, seq, d)``, sharded along seq the way PyTorch does, its
    head-tail load balancing included). ``kernel``: "math" forces SDPA's MATH kernel, "default" not."""
    buffers = [t.detach().clone() for t in tensors]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * len(buffers)):
        if KERNELS[kernel] is None:
            yield buffers
        else:
            with sdpa_kernel(KERNELS[kernel]):
                yield buffers


def peer_step(q, k, v, grad, causal: bool):
    """One forward and backward of SDPA on this rank's shards (inside ``torch_context_parallel``)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


def probe(dtype=torch.float64, batch: int = 2, heads: int = 4, seq: int = 16, head_dim: int = 8) -> dict:
    """Rank function: PyTorch's context parallelism on SDPA, each kernel choice, causal and not,
    against one process. ``{"<kernel> <causal|not-causal>": {"ok", "why", "max_diff", "collectives"}}``."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype) for _ in range(4))
    found = {}
    for kernel in KERNELS:
        for causal in (True, False):
            name = f"{kernel} {'causal' if causal else 'not-causal'}"
            reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            counter = CommDebugMode()
            try:
                with torch_context_parallel(mesh, (q, k, v, grad), kernel) as (lq, lk, lv, lg), counter:
                    out, _ = peer_step(lq, lk, lv, lg, causal)
                    (whole,) = context_parallel_unshard(mesh, [out], [2])
                found[name] = {"ok": True, "why": "", "max_diff": (whole - reference).abs().max().item(),
                               "collectives": {str(op).rsplit(".", 1)[-1]: n
                                               for op, n in counter.get_comm_counts().items()}}
            except Exception as exc:  # what fails, and why, is the finding
                found[name] = {"ok": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return found
