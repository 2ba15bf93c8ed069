"""The server's pieces that need no model: stop sequences on streamed text, OpenAI sampling
fields -> MNN's sampler, strict request validation with OpenAI's error fields."""
import pytest

from mnnllm_core.llm.sampler import SamplerConfig
from mnnllm_core.serve.errors import ApiError
from mnnllm_core.serve.sampling import sampler_overrides
from mnnllm_core.serve.schemas import ChatCompletionRequest, CompletionRequest, parse_json, validate
from mnnllm_core.llm.config import resolve_config_path
from mnnllm_core.serve.server import is_loopback
from mnnllm_core.serve.stops import StopMatcher
from paths import MODEL_DIR

MIXED = SamplerConfig()  # MNN's defaults: mixed topK, tfs, typical, topP, min_p, temperature
GREEDY = SamplerConfig(sampler_type="greedy")


def _feed_all(matcher, pieces):
    shown = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        shown.append(text)
        if stopped:
            return shown, True
    return shown + [matcher.flush()], False


def test_a_stop_sequence_across_pieces_is_found_and_nothing_of_it_is_shown():
    shown, stopped = _feed_all(StopMatcher([" of Fr"]), ["The cap", "ital of", " France"])
    assert stopped and "".join(shown) == "The capital"
    assert shown == ["The cap", "ital", ""]  # " of" was held back: it might have begun the stop


def test_held_back_text_is_shown_once_it_cannot_begin_a_stop():
    matcher = StopMatcher(["END"])
    assert matcher.feed("abcE") == ("abc", False)
    assert matcher.feed("Nx") == ("ENx", False)
    assert matcher.feed("yE") == ("y", False)
    assert matcher.flush() == "E"


def test_the_earliest_of_several_stop_sequences_cuts_the_text():
    assert StopMatcher(["b", "a"]).feed("xab") == ("x", True)
    assert StopMatcher([]).feed("anything") == ("anything", False)


def _sampler(request_fields, base=MIXED):
    overrides = sampler_overrides(validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}],
                                                                   **request_fields}), base)
    if overrides is None:
        return None
    model_config = {"sampler_type": base.sampler_type, "mixed_samplers": list(base.mixed_samplers)}
    return SamplerConfig.from_config({**model_config, **overrides})


def test_a_request_without_sampling_fields_keeps_the_model_sampler():
    assert _sampler({}) is None
    seeded = _sampler({"seed": 7})
    assert seeded.seed == 7 and seeded.stage_order == MIXED.stage_order


def test_temperature_zero_is_greedy_with_the_penalty_step_when_asked():
    greedy = _sampler({"temperature": 0, "top_p": 0.5})
    assert greedy.select_type == "greedy" and greedy.stage_order == ()
    penalised = _sampler({"temperature": 0, "frequency_penalty": 0.5})
    assert penalised.select_type == "greedy" and penalised.stage_order == ("penalty",)
    assert penalised.frequency_penalty == 0.5


def test_sampling_fields_add_their_stages_in_mnn_order_and_draw_at_the_temperature():
    config = _sampler({"temperature": 0.7, "top_k": 5, "presence_penalty": 0.3}, base=GREEDY)
    assert config.select_type == "temperature" and config.temperature == 0.7
    assert config.stage_order == ("penalty", "topK") and config.top_k == 5
    mixed = _sampler({"top_p": 0.5, "min_p": 0.2})
    assert mixed.stage_order == ("topK", "tfs", "typical", "topP", "minP")
    assert (mixed.top_p, mixed.min_p) == (0.5, 0.2)
    assert "topK" not in _sampler({"top_k": 0}).stage_order


def test_a_penalty_on_a_greedy_model_stays_greedy():
    config = _sampler({"repetition_penalty": 1.3}, base=GREEDY)
    assert config.select_type == "greedy" and config.stage_order == ("penalty",)


def test_logit_bias_reaches_the_sampler_by_token_id():
    config = _sampler({"logit_bias": {"2": -100, "504": 5}})
    assert config.logit_bias == {2: -100.0, 504: 5.0} and config.stage_order[0] == "logit_bias"


def _error(model, data) -> ApiError:
    with pytest.raises(ApiError) as caught:
        validate(model, data)
    return caught.value


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("fields, param, code", [
    ({"max_tokens": "5"}, "max_tokens", "invalid_type"),
    ({"max_tokens": True}, "max_tokens", "invalid_type"),
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"temperature": 2.5}, "temperature", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"stop": [""]}, "stop", "invalid_value"),
    ({"n": 0}, "n", "invalid_value"),
    ({"n": 9}, "n", "invalid_value"),
    ({"logit_bias": {"the": 1}}, "logit_bias", "invalid_value"),
    ({"presence_penalty": -1}, "presence_penalty", "invalid_value"),
    ({"functions": []}, "functions", "unknown_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "invalid_value"),
    ({"top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
])
def test_bad_fields_are_named_as_openai_names_them(fields, param, code):
    err = _error(ChatCompletionRequest, {**CHAT, **fields})
    assert (err.status, err.param, err.code) == (400, param, code)
    assert err.body()["error"]["type"] == "invalid_request_error" and param in err.body()["error"]["message"]


def test_missing_messages_and_non_object_bodies_are_refused():
    assert _error(ChatCompletionRequest, {}).code == "missing_required_parameter"
    assert _error(ChatCompletionRequest, [1, 2]).param is None


def test_bad_json_and_non_json_numbers_are_refused():
    for body in (b"{bad", b'{"temperature": NaN}', b"\xff"):
        with pytest.raises(ApiError) as caught:
            parse_json(body)
        assert caught.value.status == 400 and caught.value.code == "invalid_json"


def test_messages_become_template_messages():
    request = validate(ChatCompletionRequest, {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "there"}]}]})
    assert [m.as_template_message() for m in request.messages] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, there"}]
    assert request.completion_budget is None
    assert validate(ChatCompletionRequest, {**CHAT, "max_completion_tokens": 9, "max_tokens": 3}).completion_budget == 9


def test_a_completion_prompt_is_one_string_or_token_ids():
    assert validate(CompletionRequest, {"prompt": ["one"]}).prompt == "one"
    assert validate(CompletionRequest, {"prompt": [1, 2]}).prompt == [1, 2]
    assert _error(CompletionRequest, {"prompt": ["one", "two"]}).param == "prompt"
    assert _error(CompletionRequest, {"prompt": [-1]}).param == "prompt"


def test_loopback_addresses_and_model_folders():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert resolve_config_path(str(MODEL_DIR)) == str(MODEL_DIR / "config.json")
