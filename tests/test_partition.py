"""Stage balancing (parallel_lab.pipeline.partition) and the per-layer profile it balances
(parallel_lab.pipeline.profile)."""

import itertools
import random

import pytest
import torch
from torch import nn

from parallel_lab import models
from parallel_lab.pipeline import partition, profile
from parallel_lab.pipeline.partition import balanced, stage_loads, uniform

CFG = models.GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=6)


def brute_force(weights, stages):
    """Min over every contiguous split of the heaviest stage's load."""
    n = len(weights)
    return min(max(stage_loads(weights, [0, *cuts, n]))
               for cuts in itertools.combinations(range(1, n), stages - 1))


def _valid(parts, n, stages):
    increasing = all(b > a for a, b in zip(parts, parts[1:]))
    return len(parts) == stages + 1 and parts[0] == 0 and parts[-1] == n and increasing


# ----------------------------------------------------------------------------------------------
# Exactness.


def test_balanced_is_exact_against_brute_force():
    rng = random.Random(0)
    for _ in range(600):
        n = rng.randint(1, 9)
        stages = rng.randint(1, n)
        weights = [rng.choice([0, 0.1, 0.3, 1, 2, 3.7, rng.random() * 5]) for _ in range(n)]
        parts = balanced(weights, stages)
        assert _valid(parts, n, stages), (weights, stages, parts)
        assert max(stage_loads(weights, parts)) == pytest.approx(brute_force(weights, stages), rel=1e-12, abs=1e-12)


def test_balanced_integer_weights_are_exact_to_the_unit():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(2, 10)
        stages = rng.randint(1, n)
        weights = [rng.randint(0, 20) for _ in range(n)]
        assert max(stage_loads(weights, balanced(weights, stages))) == brute_force(weights, stages)


def test_balanced_known_cases():
    assert balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    assert balanced([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]  # 5 | 5, not the "half the layers" 7 | 3
    assert balanced([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [0, 5, 7, 9]  # 15 | 13 | 17: bottleneck 17
    assert max(stage_loads(list(range(1, 10)), [0, 5, 7, 9])) == brute_force(list(range(1, 10)), 3) == 17


def test_balanced_beats_uniform_on_uneven_layers():
    weights = [10, 1, 1, 1, 1, 1, 1, 10]  # heavy embedding and head, light blocks
    assert max(stage_loads(weights, uniform(8, 4))) == 11
    assert max(stage_loads(weights, balanced(weights, 4))) == 10


def test_large_inputs_stay_fast():
    weights = [1.0 + (i % 7) * 0.1 for i in range(300)]
    parts = balanced(weights, 16)
    assert _valid(parts, 300, 16)


# ----------------------------------------------------------------------------------------------
# DeepSpeed semantics.


@pytest.mark.parametrize("n, stages, expected", [
    (10, 4, [0, 3, 6, 8, 10]),  # the first 10 % 4 = 2 stages get one more (ds_utils.partition_uniform)
    (7, 3, [0, 3, 5, 7]),
    (8, 4, [0, 2, 4, 6, 8]),
    (5, 5, [0, 1, 2, 3, 4, 5]),
    (3, 1, [0, 3]),
])
def test_uniform_matches_deepspeed(n, stages, expected):
    assert uniform(n, stages) == expected


def test_parameters_method_weights_trainable_parameters():
    layers = models.GPT(CFG).as_sequential()
    counts = partition.parameter_counts(layers)
    assert counts == [sum(p.numel() for p in layer.parameters()) for layer in layers]
    layers[0].tok.weight.requires_grad_(False)  # frozen weights do not count (requires_grad filter)
    assert partition.parameter_counts(layers)[0] == counts[0] - CFG.vocab * CFG.hidden
    parts = partition.partition(layers, 3, "parameters")
    weights = partition.parameter_counts(layers)
    assert max(stage_loads(weights, parts)) == brute_force(weights, 3)


def test_type_method_spreads_matching_layers():
    layers = models.GPT(CFG).as_sequential()  # Embeddings, Block x 6, LMHead
    assert partition.type_matches(layers, "block") == [0, 1, 1, 1, 1, 1, 1, 0]  # case-insensitive search
    assert partition.type_matches(layers, "^Emb") == [1, 0, 0, 0, 0, 0, 0, 0]
    parts = partition.partition(layers, 3, "type:Block")
    assert [sum(partition.type_matches(layers[a:b], "block")) for a, b in zip(parts, parts[1:])] == [2, 2, 2]
    assert parts == [0, 3, 5, 8]  # embed + 2 blocks | 2 blocks | 2 blocks + head


def test_functions_weigh_zero():
    layers = [nn.Linear(4, 4), torch.relu, nn.Linear(4, 8)]
    assert partition.parameter_counts(layers) == [20, 0, 40]
    assert partition.type_matches(layers, "relu") == [0, 1, 0]


def test_time_method_balances_profiled_time():
    records = [profile.LayerProfile(i, str(i), "X", 0, 0, f, 2 * f, 0) for i, f in enumerate([4, 1, 1, 1, 1, 1])]
    layers = [nn.Identity() for _ in records]
    parts = partition.partition(layers, 3, "time", profile=records)
    costs = [r.time_s for r in records]
    assert max(stage_loads(costs, parts)) == brute_force(costs, 3) == 12  # fwd + bwd of the heavy layer
    assert max(stage_loads(costs, uniform(6, 3))) == 15


@pytest.mark.parametrize("call, message", [
    (lambda: uniform(3, 5), "stages 5 > layers 3: every stage needs at least one layer"),
    (lambda: balanced([1, 2], 0), "stages must be a positive integer, got stages 0"),
    (lambda: balanced([1, -2, 3], 2), "weights must be >= 0, got weight -2 at layer 1"),
    (lambda: balanced([], 1), "cannot partition an empty list of layers"),
    (lambda: partition.partition(models.GPT(CFG), 2, "profile"), "unknown partition method 'profile'"),
    (lambda: partition.partition(models.GPT(CFG), 4, "type:LMHead"), "type:LMHead matches 1 layer < stages 4"),
    (lambda: partition.partition(models.GPT(CFG), 2, "time"), "method 'time' needs profile="),
])
def test_errors_are_clear(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_describe_lists_layers_per_stage():
    text = partition.describe([0, 2, 3], ["embed", "b0", "head"], [1, 2, 3])
    assert text.splitlines() == ["stage 0: layers 0..1 (embed, b0)  load 3", "stage 1: layers 2..2 (head)  load 3"]


# ----------------------------------------------------------------------------------------------
# The profile.


def test_profile_of_the_tiny_gpt():
    records = profile.profile_course_model("gpt", batch=2, repeats=3, **vars(CFG))
    model = models.GPT(CFG)
    layers = model.as_sequential()
    assert [r.type for r in records] == ["Embeddings"] + ["Block"] * 6 + ["LMHead"]
    assert [r.params for r in records] == [sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert all(r.param_bytes == 4 * r.params for r in records)
    assert all(r.fwd_s > 0 and r.bwd_s > 0 for r in records)
    # every block saves the same tensors; the measurement matches a direct one
    blocks = {r.activation_bytes for r in records if r.type == "Block"}
    x = torch.randn(2, CFG.seq, CFG.hidden, requires_grad=True)
    assert blocks == {profile.saved_activation_bytes(layers[1], x)}
    assert set(records[0].as_dict()) == {"index", "name", "type", "params", "param_bytes", "fwd_s", "bwd_s",
                                         "activation_bytes"}
    parts = partition.by_time(records, 3)
    assert _valid(parts, 8, 3)


def test_profile_restores_thread_count():
    before = torch.get_num_threads()
    profile.profile_course_model("mlp", batch=4, repeats=1, hidden=8, layers=2)
    assert torch.get_num_threads() == before


def test_profile_rejects_what_it_cannot_walk():
    with pytest.raises(TypeError, match="cannot list the layers of MLP"):
        profile.layers_of(models.MLP(8))
