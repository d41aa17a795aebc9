"""The interactive chat (`ml_run MODEL` on a terminal), driven through a pseudo-terminal: the
conversation stays in the KV cache, Ctrl-C stops an answer, /clear, /exit and Ctrl-D."""
import os
import re

import pexpect
import pytest

from conftest import ml_bin

STATUS = re.compile(r"\[prompt (\d+) tokens \((\d+) cached\), [\d.]+ tokens/s; answer (\d+) tokens")


@pytest.fixture
def chat(smollm2_gguf):
    """A chat with the SmolLM2 GGUF on a pty (greedy; answers of at most 400 tokens)."""
    c = pexpect.spawn(str(ml_bin()), [str(smollm2_gguf), "--type", "q8_0", "-n", "400"],
                      encoding="utf-8", codec_errors="replace", timeout=180, dimensions=(40, 200))
    c.expect("chatting")
    c.expect("> ")
    yield c
    c.close(force=True)


def turn(c, text):
    """Sends one user line; returns (answer text, prompt tokens, cached tokens, answer tokens)."""
    c.sendline(text)
    c.expect(STATUS)
    answer = c.before.split(text, 1)[-1]
    p, cached, a = map(int, c.match.groups())
    c.expect("> ")
    return answer, p, cached, a


def test_second_turn_reuses_the_first_from_the_cache(chat):
    ans1, p1, cached1, a1 = turn(chat, "What is the capital of France?")
    assert "Paris" in ans1 and cached1 == 0, ans1
    ans2, p2, cached2, a2 = turn(chat, "And what is its most famous tower?")
    # The second question does not name the city: the answer knows it from the first turn...
    assert "Paris" in ans2, ans2
    # ...which was not evaluated again: the whole first turn (its prompt and every answer token)
    # is reused from the cache, and the second evaluates only the template's text between the
    # answer and the new assistant header.
    assert cached2 == p1 + a1, (p1, a1, cached2)
    assert 0 < p2 < 25, p2
    # /clear starts over: nothing cached.
    chat.sendline("/clear")
    chat.expect("> ")
    _, p3, cached3, _ = turn(chat, "What is the capital of France?")
    assert (p3, cached3) == (p1, 0)
    chat.sendline("/exit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_ctrl_c_stops_an_answer_and_ctrl_d_leaves(chat):
    chat.sendline("Write a very long story about a dragon, at least 500 words.")
    chat.expect("500 words.\r\n")  # the terminal's echo of the line
    chat.expect(r"\w+ \w+ \w+ \w+ \w+")  # the answer is streaming
    chat.sendintr()
    chat.expect(STATUS)
    _, _, answered = map(int, chat.match.groups())
    chat.expect(r"\(stopped\)")
    assert answered < 400
    chat.expect("> ")
    # Still chatting after the stop, with the stopped answer kept in the conversation.
    _, _, cached, _ = turn(chat, "Thank you.")
    assert cached > answered
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_ctrl_c_at_the_prompt_leaves_with_130(chat):
    chat.sendintr()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 130


def test_bytes_that_are_not_utf8_do_not_end_the_chat(chat):
    os.write(chat.child_fd, b"caf\xe9?\r")  # Latin-1, as from a terminal in another encoding
    chat.expect(STATUS)
    chat.expect("> ")
    chat.sendline("/exit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0
