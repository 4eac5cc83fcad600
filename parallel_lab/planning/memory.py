"""Training memory on one device: where the bytes go, and why a big model must be split.

    from parallel_lab.planning import memory
    gpt3 = memory.MODELS["GPT-3 175B"]
    memory.breakdown(gpt3, micro_batch=1)      # bytes: weights, gradients, optimizer, activations, total
    memory.min_devices(gpt3.params, "H100 80GB")   # -> 35: GPUs needed just to hold the model state

Introduced in lessons/00_why_split_a_model.ipynb. Pure arithmetic on integers (no torch):

- **Model state** (Rajbhandari et al. 2020, "ZeRO", section 3.1): mixed-precision Adam keeps 16 bytes
  per parameter -- 2 (fp16/bf16 weights) + 2 (fp16/bf16 gradients) + 12 (fp32 master weights, momentum,
  variance). Plain fp32 Adam keeps 4 + 4 + 8 bytes: the same 16, which is why mixed precision does not
  shrink the model state.
- **Activations** of a GPT-style transformer layer (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", section 4): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer with
  16-bit activations and no recomputation; ``2*s*b*h`` per layer with full recomputation (only each
  layer's input is kept). s sequence, b micro-batch, h hidden, a heads.
- **Parameters** of a GPT (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM"): ``12*L*h^2 + (V + s)*h``. With ``experts`` E > 0 every block's MLP
  is a mixture of E expert MLPs and a router (Lepikhin et al. 2020, "GShard"; Fedus et al. 2021,
  "Switch Transformers"): ``L*(4h^2 + E*8h^2 + E*h) + (V + s)*h``, of which a token uses only its
  ``top_k`` experts (``active_params``).

Sizes are in bytes; "GB" means 10**9 bytes, as in the papers and the GPUs' names.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_lab.checks import positive_int, positive_number
from parallel_lab.i18n import _, pad, width

GB = 10**9


def _lookup(table: dict, kind: str, key):
    if isinstance(key, str):
        if key not in table:
            raise ValueError(f"unknown {kind} {key!r}; known: {', '.join(table)}")
        return table[key]
    return key


# ----------------------------------------------------------------------------------------------
# Models, precisions and GPUs.


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-style transformer: ``layers`` blocks of width ``hidden`` with ``heads`` attention heads,
    a vocabulary of ``vocab`` tokens and sequences of ``seq`` tokens. ``experts`` E > 0 makes every
    block's MLP a mixture of E experts (the course's 4h GELU MLP each, as ``models.MoE``) of which
    each token uses ``top_k``; 0 (the default) is the dense model, and ``top_k`` is then unused."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 50257
    seq: int = 2048
    experts: int = 0
    top_k: int = 2

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "vocab", "seq"):
            positive_int(field, getattr(self, field))
        if self.experts:
            positive_int("experts", self.experts)
            positive_int("top_k", self.top_k)
            if self.top_k > self.experts:
                raise ValueError(f"MoE needs top_k <= experts, got top_k {self.top_k}, experts {self.experts}")
        elif self.experts != 0:
            raise ValueError(f"experts must be 0 (dense) or a positive integer, got experts {self.experts!r}")

    @property
    def params(self) -> int:
        return gpt_params(self.layers, self.hidden, self.vocab, self.seq, self.experts)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: its ``top_k`` experts (and the router) in place of
        all E (Fedus et al. 2021, section 2); ``params`` for a dense model."""
        if not self.experts:
            return self.params
        h = self.hidden
        return self.layers * (4 * h * h + self.top_k * 8 * h * h + self.experts * h) + (self.vocab + self.seq) * h


def gpt_params(layers: int, hidden: int, vocab: int = 50257, seq: int = 2048, experts: int = 0) -> int:
    """Parameters of a GPT: ``12*L*h^2`` in the blocks (4h^2 attention + 8h^2 MLP) plus token and
    position embeddings ``(V + s)*h``; biases and layer norms (about 13*L*h) are left out
    (Narayanan et al. 2021). With ``experts`` E > 0 each block holds E expert MLPs and a router
    (h x E, no bias; GShard, Lepikhin et al. 2020): ``L*(4h^2 + E*8h^2 + E*h) + (V + s)*h``."""
    layers, hidden = positive_int("layers", layers), positive_int("hidden", hidden)
    vocab, seq = positive_int("vocab", vocab), positive_int("seq", seq)
    if experts:
        E = positive_int("experts", experts)
        return layers * (4 * hidden**2 + E * 8 * hidden**2 + E * hidden) + (vocab + seq) * hidden
    return 12 * layers * hidden**2 + (vocab + seq) * hidden


# GPT-3 paper (Brown et al. 2020), Table 2.1: layers, d_model, heads; vocabulary 50257, context 2048.
# 13B's d_model is 5140 as printed there. 530B and 1T: Narayanan et al. 2021, Table 1 (vocab 51200).
MODELS = {m.name: m for m in (
    ModelConfig("GPT-3 1.3B", 24, 2048, 24),
    ModelConfig("GPT-3 2.7B", 32, 2560, 32),
    ModelConfig("GPT-3 6.7B", 32, 4096, 32),
    ModelConfig("GPT-3 13B", 40, 5140, 40),
    ModelConfig("GPT-3 175B", 96, 12288, 96),
    ModelConfig("Megatron 530B", 105, 20480, 128, vocab=51200),
    ModelConfig("Megatron 1T", 128, 25600, 160, vocab=51200),
)}

# Mixtures of experts, kept apart from MODELS (lesson 00's dense table and figures list every one of
# those). Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1): 32 layers, dim 4096, 32
# heads (8 KV heads), 8 experts top-2, SwiGLU experts of hidden_dim 14336, vocabulary 32000, context
# 32768; 46.7B parameters, 12.9B active. In the course's terms (full multi-head attention, 4h GELU
# experts, learned position embeddings) the same sizes give 36.8B (11.0B active): an approximation --
# a SwiGLU expert of width 14336 holds 3*4096*14336 = 176M parameters, a 4h GELU one 8*4096^2 = 134M.
MOE_MODELS = {m.name: m for m in (
    ModelConfig("Mixtral 8x7B (approx.)", 32, 4096, 32, vocab=32000, seq=32768, experts=8, top_k=2),
)}


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter for weights, gradients and Adam's state, and bytes per activation value."""

    name: str
    weights: int
    gradients: int
    optimizer: int
    activation: int

    @property
    def per_param(self) -> int:
        return self.weights + self.gradients + self.optimizer


PRECISIONS = {
    # ZeRO (Rajbhandari et al. 2020): fp16 weights and grads, fp32 master weights + momentum + variance.
    "mixed": Precision("mixed precision (bf16/fp16 + fp32 Adam)", 2, 2, 12, 2),
    "fp32": Precision("fp32 Adam", 4, 4, 8, 4),
}

# Nominal memory, as in the products' names (usable memory is a little less).
GPUS = {
    "V100 16GB": 16 * GB,
    "A100 40GB": 40 * GB,
    "A100 80GB": 80 * GB,
    "H100 80GB": 80 * GB,
    "H200 141GB": 141 * GB,
}


# ----------------------------------------------------------------------------------------------
# The arithmetic.


def model_state(params, precision="mixed") -> dict:
    """Bytes for ``weights``, ``gradients`` and ``optimizer`` (Adam) for ``params`` parameters."""
    params = positive_number("params", params)
    p = _lookup(PRECISIONS, "precision", precision)
    return {part: round(params * getattr(p, part)) for part in ("weights", "gradients", "optimizer")}


def activations(model: ModelConfig, micro_batch: int = 1, seq: int | None = None,
                precision="mixed", recompute: bool = False) -> int:
    """Bytes of activations kept for the backward pass by all transformer layers of ``model``
    (embeddings and logits left out), one micro-batch of ``micro_batch`` sequences of ``seq`` tokens
    (default ``model.seq``).

    Korthikanti et al. 2022, section 4: per layer ``s*b*h*(34 + 5*a*s/h)`` bytes with 2-byte values;
    the 34 counts sixteen 2-byte tensors of shape (s, b, h) and two 1-byte dropout masks, the 5 counts
    two 2-byte (a, s, s) attention tensors and one 1-byte mask, so 4-byte values give ``66`` and ``9``.
    With full recomputation only each layer's input is kept: ``s*b*h`` values per layer.
    """
    m = _lookup(MODELS, "model", model)
    b, s = positive_int("micro_batch", micro_batch), positive_int("seq", m.seq if seq is None else seq)
    v = _lookup(PRECISIONS, "precision", precision).activation
    h, a = m.hidden, m.heads
    if recompute:
        return m.layers * v * s * b * h
    return m.layers * (s * b * h * (16 * v + 2) + (2 * v + 1) * a * s * s * b)


def breakdown(model: ModelConfig, micro_batch: int = 1, seq: int | None = None,
              precision="mixed", recompute: bool = False) -> dict:
    """Bytes on one device training ``model`` unsplit: ``weights``, ``gradients``, ``optimizer``,
    ``activations`` and their ``total``."""
    m = _lookup(MODELS, "model", model)
    parts = model_state(m.params, precision)
    parts["activations"] = activations(m, micro_batch, seq, precision, recompute)
    parts["total"] = sum(parts.values())
    return parts


def min_devices(params, gpu="H100 80GB", precision="mixed") -> int:
    """The fewest devices of memory ``gpu`` (a name from GPUS, or bytes) that can hold the weights,
    gradients and Adam state of ``params`` parameters split evenly: a lower bound, since activations,
    buffers and fragmentation need room too (ZeRO stage 3 reaches it)."""
    capacity = positive_int("gpu memory (bytes)", _lookup(GPUS, "GPU", gpu))
    need = sum(model_state(params, precision).values())
    return -(-need // capacity)


def summary(model="GPT-3 175B", micro_batch: int = 1, seq: int | None = None, precision="mixed",
            recompute: bool = False, gpu="H100 80GB") -> str:
    """One line describing a configuration, e.g. for the lesson's widget."""
    m = _lookup(MODELS, "model", model)
    parts = breakdown(m, micro_batch, seq, precision, recompute)
    gpu_bytes = _lookup(GPUS, "GPU", gpu)
    gpu_name = gpu if isinstance(gpu, str) else f"{gpu / GB:g} GB"
    state, every = min_devices(m.params, gpu_bytes, precision), -(-parts["total"] // gpu_bytes)
    text = _("{model} ({params:.1f}B params), {precision}, micro-batch {micro_batch} x {seq} tokens, recomputation "
             "on: {total:,.1f} GB = {gpus:,.2f} x {gpu}; at least {state} {GPUs} for the model state, {every} with "
             "activations") if recompute else \
        _("{model} ({params:.1f}B params), {precision}, micro-batch {micro_batch} x {seq} tokens, recomputation "
          "off: {total:,.1f} GB = {gpus:,.2f} x {gpu}; at least {state} {GPUs} for the model state, {every} with "
          "activations")
    return text.format(model=m.name, params=m.params / 1e9, precision=_lookup(PRECISIONS, "precision", precision).name,
                       micro_batch=micro_batch, seq=m.seq if seq is None else seq, total=parts["total"] / GB,
                       gpus=parts["total"] / gpu_bytes, gpu=gpu_name, state=state,
                       GPUs="GPUs" if state > 1 else "GPU", every=every)


def table(models=tuple(MODELS), micro_batch: int = 1, precision="mixed", recompute: bool = False,
          gpu="H100 80GB") -> str:
    """A text table, one row per model preset: GB per component, the total, and the fewest GPUs of
    memory ``gpu`` for the model state alone and with the activations (both lower bounds)."""
    gpu_bytes = positive_int("gpu memory (bytes)", _lookup(GPUS, "GPU", gpu))
    head = (f"{pad(_('model'), 14)} {pad(_('params'), 7, '>')} {pad(_('weights'), 8, '>')} "
            f"{pad(_('grads'), 8, '>')} {'Adam':>8} {pad(_('activ.'), 8, '>')} {pad(_('total GB'), 9, '>')} "
            f"{pad(_('GPUs: state'), 11, '>')} {pad(_('+activ.'), 7, '>')}")
    rows = [head, "-" * width(head)]
    for name in models:
        m = _lookup(MODELS, "model", name)
        p = breakdown(m, micro_batch, None, precision, recompute)
        gb = {k: f"{v / GB:,.1f}" for k, v in p.items()}
        rows.append(f"{m.name:<14} {m.params / 1e9:>6.1f}B {gb['weights']:>8} {gb['gradients']:>8} "
                    f"{gb['optimizer']:>8} {gb['activations']:>8} {gb['total']:>9} "
                    f"{min_devices(m.params, gpu_bytes, precision):>11} {-(-p['total'] // gpu_bytes):>7}")
    return "\n".join(rows)
