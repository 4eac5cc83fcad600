"""Outputs that answer a prediction wait until the student runs their cell (parallel_lab.course.hidden):
the build hides them behind a reveal, nbval gets the real ones back, a reader sees the summary only."""

import nbformat

from parallel_lab import i18n
from parallel_lab.course import hidden


def executed_notebook():
    answer = nbformat.v4.new_code_cell("guess.versus(3 / 7)", metadata={"tags": ["reveals:gpipe-bubble"]},
                                       execution_count=3)
    answer.outputs = [nbformat.v4.new_output("stream", name="stdout", text="bubble 0.429\n"),
                      nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": {
                          "data": [], "layout": {"title": {"text": "GPipe: bubble 0.429"}}}, "image/png": "iVBORw0K"})]
    other = nbformat.v4.new_code_cell("x = 1", execution_count=4)
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    return nbformat.v4.new_notebook(cells=[answer, other])


def test_the_build_hides_the_answer_and_nbval_gets_it_back():
    nb = executed_notebook()
    real = [dict(o) for o in nb.cells[0].outputs]
    assert hidden.hide(nb) == [nb.cells[0].get("id")] and hidden.hide(nb) == []  # once
    cell = nb.cells[0]
    (shown,) = cell.outputs
    assert hidden.visible_text(shown) == hidden.summary(["gpipe-bubble"]) and "0.429" not in hidden.visible_text(shown)
    assert "<details>" in shown.data["text/html"] and "bubble 0.429" in shown.data["text/html"]
    assert 'src="data:image/png;base64,iVBORw0K"' in shown.data["text/html"]
    assert "image/png" not in hidden.reference_outputs(cell)[1]["data"]  # nbval never compares PNGs
    written = nbformat.reads(nbformat.writes(nb), as_version=4)  # what is committed
    assert hidden.is_hidden(written.cells[0]) and not hidden.is_hidden(written.cells[1])
    assert hidden.restore(written.cells[0]) and not hidden.restore(written.cells[1])
    restored = written.cells[0].outputs
    assert restored[0].text == real[0]["text"] and restored[1].output_type == "display_data"
    assert written.cells[1].outputs[0].text == "1\n"


def test_a_reader_sees_a_figures_words_but_not_its_numbers():
    figure = {"output_type": "display_data", "metadata": {}, "data": {"application/vnd.plotly.v1+json": {
        "data": [{"y": [0.429], "name": "GPipe"}], "layout": {"title": {"text": "bubble"}}}}}
    assert hidden.visible_text(figure).split("\n") == ["GPipe", "bubble"]


def test_the_placeholder_speaks_the_lessons_language():
    nb = executed_notebook()
    with i18n.using("zh-Hant"):
        hidden.hide(nb)
    assert hidden.visible_text(nb.cells[0].outputs[0]).startswith("輸出已隱藏")
