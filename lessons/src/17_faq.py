# %% [markdown]
# # 17 · The FAQ: six questions, in both languages
#
# The course grew from an article on model and pipeline parallelism (in Traditional Chinese); its
# FAQ asks six questions. This short lesson puts each next to the lesson where you ran the answer
# for real, then asks them again in a quiz — in English or in 繁體中文 (switch in the quiz). It is
# graded like every other lesson's quiz.
#
# 本課程源自一篇以繁體中文撰寫、介紹模型平行與管線平行（model and pipeline parallelism）的文章；文章的
# 常見問題（FAQ）有六題。本課把每一題連到你實際執行過答案的那一課，最後以測驗再問一次（可切換英文或中文）。
#
# **Learning goals.** You can answer each of the six questions in a sentence, point to the
# measurement in the course that backs the answer, and work out the bubble's share of a step for
# any pipeline depth, number of micro-batches and interleaving.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## The six questions, and where the course answers them
#
# The first three: what model parallelism is, and how a layer is split.
#
# | # | the article's question | the short answer | run it in |
# |---|---|---|---|
# | 1 | What is model and pipeline parallelism? 什麼是模型平行與管線平行？ | When a model is too big for one GPU, the model itself is split across devices. | [00](00_why_split_a_model.ipynb): GPT-3 175B needs at least 35 GPUs of 80 GB just for its state |
# | 2 | What fundamental problem does it solve? 它解決了什麼根本問題？ | It trains networks far larger than any single GPU can hold, by partitioning the model. | [00](00_why_split_a_model.ipynb), [15](15_cost_model.ipynb), [16](16_planner.ipynb): memory per GPU under every split |
# | 3 | How does tensor (intra-layer) splitting work? 張量（層內）平行如何分割？ | It splits the math inside a layer — a weight matrix by columns (行, column) or rows (列, row) — so each GPU computes part of the output, recombined with all-reduce. | [02](02_tensor_parallelism.ipynb): column and row splits on real ranks, Megatron's f and g |

# %% [markdown]
# The last three: the pipeline's bubble, and why tensor parallelism stays in a node. The article's own
# words for all six are in `quizzes/faq_source.md`.
#
# | # | the article's question | the short answer | run it in |
# |---|---|---|---|
# | 4 | What is the "bubble" in simple pipeline parallelism? 簡單管線平行中的「氣泡」是什麼？ | Early in a step, downstream stages have no input yet and sit idle (and upstream ones at the end): that idle time is the bubble. | [03](03_pipeline_bubble.ipynb): the naive split's idle time on two clocks |
# | 5 | How does pipelining reduce the bubble? 管線平行如何縮小氣泡？ | Micro-batches let several stages work at once: GPipe's bubble is (p−1)/(m+p−1); interleaving and zero-bubble schedules shrink it further. | [04](04_gpipe_microbatching.ipynb), [05](05_1f1b_memory.ipynb), [06](06_interleaved_1f1b.ipynb), [07](07_zero_bubble.ipynb), [10](10_schedule_search.ipynb) |
# | 6 | Why is tensor parallelism kept inside one node? 為什麼張量平行通常留在單一節點內？ | It all-reduces partial results in every layer, forward and backward: only the fast NVLink domain keeps that cheaper than the compute: 8 GPUs in a DGX/HGX node, 72 in a GB200 NVL72 rack. | [02](02_tensor_parallelism.ipynb), [11](11_3d_parallelism.ipynb), [15](15_cost_model.ipynb), [16](16_planner.ipynb) |

# %% [markdown]
# ## Two ways to shrink the bubble
#
# FAQ 5 names two remedies: more micro-batches, and interleaving (each GPU holds v model chunks, so
# each slot of the fill and the drain is 1/v as long). **Predict** before you run: with p = 8 stages
# and m = 16 micro-batches, which shrinks the bubble's share of the step more — doubling the
# micro-batches to 32, or interleaving with v = 2 at m = 16?

# %% tags=["answer:predict:more-or-interleave"]
my_prediction = None  # "more micro-batches", "interleaving" or "the same"
### BEGIN SOLUTION
my_prediction = "the same"
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

remedy_guess = predict("more-or-interleave", my_prediction,
                       {"en": "which shrinks the bubble's share more at p = 8, m = 16: m = 32, or v = 2",
                        "zh-Hant": "在 p = 8、m = 16 時，哪一個更能縮小氣泡占一步的比例：m = 32，還是 v = 2"},
                       choices=({"en": "more micro-batches", "zh-Hant": "更多微批次"},
                                {"en": "interleaving", "zh-Hant": "交錯"},
                                {"en": "the same", "zh-Hant": "一樣"}))

# %% tags=["reveals:more-or-interleave"]
from parallel_lab.exercises.bubble_share import simulated_share

shares = {(m, v): simulated_share(8, m, v) for m, v in ((16, 1), (32, 1), (16, 2))}  # p = 8
print("\n".join(f"p = 8, m = {m:>2}, v = {v}: {share:.4f}" for (m, v), share in shares.items()))
doubled, interleaved = shares[32, 1], shares[16, 2]
remedy_guess.versus("the same" if abs(doubled - interleaved) < 1e-9 else
                    "more micro-batches" if doubled < interleaved else "interleaving",
                    {"en": "the simulator", "zh-Hant": "模擬器"})

# %% [markdown]
# Doubling m puts twice the work behind the same fill and drain; interleaving makes the fill and
# drain shorter behind the same work. What differs is the price: doubling m halves each micro-batch
# (smaller matrix products) or doubles the batch, while interleaving sends v times the activations
# between stages (lesson 06).
#
# ### Exercise: FAQ 5 as a number
#
# Write `my_bubble_share(p, m, v)`: the share of a step that a GPU sits idle under 1F1B (v = 1; GPipe
# is the same) and under interleaved 1F1B with v chunks per GPU, every stage taking the same time for a
# forward (and for a backward). The check simulates each case's schedule (lesson 04's simulator) and
# compares your share with the simulator's, on 9 cases. Import at most `math` and `fractions`.

# %% tags=["answer:bubble-share"]
def my_bubble_share(p, m, v=1):
    """The idle share of a training step: p stages, m micro-batches, v model chunks per GPU."""
    ### BEGIN SOLUTION
    return (p - 1) / (v * m + p - 1)
    ### END SOLUTION


# %% tags=["check:bubble-share", "points:1"]
from parallel_lab.exercises import check_bubble_share

verdict = check_bubble_share(my_bubble_share)

# %% [markdown]
# ## What to remember
#
# - Model parallelism splits the model itself: tensor parallelism inside a layer, pipeline
#   parallelism across layers; both exist because the model state and activations outgrow one GPU.
# - The pipeline bubble is idle time: (p − 1)(F + B) per GPU in total for GPipe and 1F1B, which
#   micro-batches, interleaving and zero-bubble schedules shrink (lessons 04–07).
# - Tensor parallelism all-reduces in every layer, so it stays inside the fast NVLink domain
#   (lessons 02, 11, 16).
