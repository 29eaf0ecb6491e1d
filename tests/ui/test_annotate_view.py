"""The annotate view's rendering of a response: escaped, and marked when it was cut at the length limit."""

from ui.web.annotate import render_side


def test_a_response_cut_at_the_length_limit_says_so_and_stays_escaped():
    cut = render_side("A", "<b>Rainbows are made when</b>", finished=False)
    ended = render_side("B", "Rainbows are sunlight split by raindrops.", finished=True)
    assert "cut off at the length limit" in cut and "cut off" not in ended
    assert "&lt;b&gt;Rainbows are made when&lt;/b&gt;" in cut and "<b>" not in cut
    assert cut.index("Rainbows") < cut.index("cut off")  # the note follows the text it is about
