"""Training-memory arithmetic (parallel_lab.planning.memory): pure, no processes."""

import math

import pytest

from parallel_lab.planning import memory
from parallel_lab.planning.memory import GB, MODELS, ModelConfig


def test_mixed_precision_adam_is_16_bytes_per_param():
    state = memory.model_state(1, "mixed")
    assert state == {"weights": 2, "gradients": 2, "optimizer": 12}
    assert sum(memory.model_state(10**9, "mixed").values()) == 16 * 10**9


def test_fp32_adam_is_also_16_bytes_per_param():
    assert memory.model_state(1, "fp32") == {"weights": 4, "gradients": 4, "optimizer": 8}


def test_gpt3_175b_parameter_count():
    params = MODELS["GPT-3 175B"].params
    assert params == 12 * 96 * 12288**2 + (50257 + 2048) * 12288
    assert params == pytest.approx(175e9, rel=0.02)


@pytest.mark.parametrize("name, billions", [("GPT-3 1.3B", 1.3), ("GPT-3 6.7B", 6.7), ("GPT-3 13B", 13),
                                            ("Megatron 530B", 530), ("Megatron 1T", 1000)])
def test_presets_match_their_names(name, billions):
    assert MODELS[name].params == pytest.approx(billions * 1e9, rel=0.03)


def test_175b_needs_2_8_tb_and_35_gpus_of_80_gb():
    assert sum(memory.model_state(175e9).values()) == 2_800 * GB
    assert memory.min_devices(175e9, "A100 80GB") == 35
    assert memory.min_devices(MODELS["GPT-3 175B"].params, 80 * GB) == 35
    assert memory.min_devices(175e9, "A100 40GB") == 70


def test_min_devices_rounds_up():
    assert memory.min_devices(1, 16) == 1
    assert memory.min_devices(1, 15) == 2
    assert memory.min_devices(5e9, "H100 80GB") == 1  # exactly 80 GB fits


def test_activations_by_hand():
    # s=4, b=2, h=8, a=2, one layer: s*b*h = 64; 34 + 5*a*s/h = 34 + 5 = 39 -> 64 * 39 = 2496 bytes.
    tiny = ModelConfig("tiny", layers=1, hidden=8, heads=2, vocab=10, seq=4)
    assert memory.activations(tiny, micro_batch=2) == 2496
    assert memory.activations(tiny, micro_batch=2, recompute=True) == 2 * 64
    # fp32 values (masks stay 1 byte): 66 s*b*h + 9 a*s^2*b = 4224 + 576.
    assert memory.activations(tiny, micro_batch=2, precision="fp32") == 4800
    # three layers, a longer sequence given explicitly: s=8 -> s*b*h = 128, 34 + 5*2*8/8 = 44.
    assert memory.activations(ModelConfig("t3", 3, 8, 2, 10, 4), 2, seq=8) == 3 * 128 * 44


def test_activations_match_the_papers_formula_for_gpt3():
    m = MODELS["GPT-3 175B"]
    s, b, h, a = 2048, 1, 12288, 96
    assert memory.activations(m) == m.layers * s * b * h * (34 + 5 * a * s // h)


def test_recomputation_lowers_activations():
    for m in MODELS.values():
        full, recomputed = memory.activations(m, 4), memory.activations(m, 4, recompute=True)
        assert recomputed < full / 10
        assert recomputed == 2 * m.seq * 4 * m.hidden * m.layers


def test_breakdown_adds_up():
    parts = memory.breakdown(MODELS["GPT-3 13B"], micro_batch=2, seq=1024, recompute=True)
    assert set(parts) == {"weights", "gradients", "optimizer", "activations", "total"}
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert memory.breakdown("GPT-3 13B") == memory.breakdown(MODELS["GPT-3 13B"])


def test_summary_is_one_line():
    line = memory.summary()
    assert "\n" not in line and "GPT-3 175B" in line and "at least 35 GPUs for the model state" in line
    assert "at least 1 GPU for" in memory.summary("GPT-3 1.3B")


@pytest.mark.parametrize("call, words", [
    (lambda: memory.model_state(0), "params must be a positive number, got params 0"),
    (lambda: memory.model_state(-5e9), "got params -5000000000.0"),
    (lambda: memory.model_state(math.nan), "got params nan"),
    (lambda: memory.gpt_params(0, 1024), "layers must be a positive integer, got layers 0"),
    (lambda: memory.gpt_params(2, 10.5), "hidden must be a positive integer, got hidden 10.5"),
    (lambda: ModelConfig("x", 2, 64, heads=-1), "heads must be a positive integer, got heads -1"),
    (lambda: memory.activations(MODELS["GPT-3 1.3B"], micro_batch=0),
     "micro_batch must be a positive integer, got micro_batch 0"),
    (lambda: memory.activations(MODELS["GPT-3 1.3B"], seq=0), "seq must be a positive integer, got seq 0"),
    (lambda: memory.min_devices(1e9, 0), "gpu memory (bytes) must be a positive integer, got gpu memory (bytes) 0"),
    (lambda: memory.min_devices(1e9, "TPU"), "unknown GPU 'TPU'; known: V100 16GB"),
    (lambda: memory.model_state(1e9, "int8"), "unknown precision 'int8'"),
    (lambda: memory.breakdown("GPT-5"), "unknown model 'GPT-5'"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert words in str(err.value)


def test_table_has_a_row_per_model():
    rows = memory.table().splitlines()
    assert len(rows) == 2 + len(MODELS)
    assert rows[6].split()[-2:] == ["35", "39"]  # GPT-3 175B on 80 GB GPUs


def test_models_figure_is_deterministic_and_labels_gpus_on_the_log_axis():
    from parallel_lab.show import memory as widgets_memory

    first, second = widgets_memory.models_figure(), widgets_memory.models_figure()
    assert first.to_json() == second.to_json()
    assert [bar.name for bar in first.data] == ["weights", "gradients", "Adam state", "activations"]
    # shapes take data coordinates, annotations on a log axis take log10 of them
    assert [s.y0 for s in first.layout.shapes] == [16, 40, 80, 141]
    assert [a.y for a in first.layout.annotations] == [round(math.log10(g), 4) for g in (16, 40, 80, 141)]
    assert first.layout.annotations[2].text == "A100 80GB / H100 80GB"


def test_config_figure_keeps_the_gpu_line_in_view():
    from parallel_lab.show import memory as widgets_memory

    fig = widgets_memory.config_figure("GPT-3 1.3B", recompute=True, gpu="H200 141GB")
    low, high = fig.layout.yaxis.range
    assert 10**low < min(fig.data[0].y) and 10**high > 141


def test_memory_widget_updates_its_summary(capsys):
    from parallel_lab.show import memory as widgets_memory

    box = widgets_memory.memory_widget()
    text = box.children[2]
    assert memory.summary() in text.value
    model = box.children[0].children[0].children[0]
    model.value = "GPT-3 1.3B"
    assert memory.summary("GPT-3 1.3B") in text.value
