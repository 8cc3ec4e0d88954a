"""The request-validation hook (``sglang_hybrid.entrypoints.validation``) called as upstream's tokenizer manager
calls it, without a server: the checks added for issue 42 (the server tests post the same requests)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_hybrid.entrypoints.validation import check_input_ids_in_vocab

VOCAB = 100


def _manager(device="cpu", spec="NEXTN"):
    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB),
                           server_args=SimpleNamespace(device=device, speculative_algorithm=spec))


def _request(**kw):
    return SimpleNamespace(**{"return_logprob": False, "sampling_params": {"max_new_tokens": 2}, **kw})


@pytest.mark.parametrize("start", [-2, -7])
def test_logprob_start_len_below_minus_one_is_refused_with_return_logprob(start):
    with pytest.raises(ValueError, match=f"logprob_start_len must be -1 .* got {start}"):
        check_input_ids_in_vocab(_manager(spec=None), _request(return_logprob=True, logprob_start_len=start), [1, 2])
    for ok in (_request(return_logprob=True, logprob_start_len=-1), _request(return_logprob=True, logprob_start_len=1),
               _request(return_logprob=False, logprob_start_len=start)):  # ignored by upstream without return_logprob
        check_input_ids_in_vocab(_manager(spec=None), ok, [1, 2])


@pytest.mark.parametrize("params", [{"n": 2, "temperature": 0.7}, {"n": 3}, {"n": 2, "temperature": 1.0, "top_k": 5}])
def test_sampled_n_under_cpu_speculation_is_refused(params):
    """Upstream's verify commits the argmax on CPU: n sampled completions would be the same greedy one."""
    with pytest.raises(ValueError, match=r"n=\d with temperature=.*speculative decoding \(NEXTN\) on CPU, whose verify "
                                         r"is greedy"):
        check_input_ids_in_vocab(_manager(), _request(sampling_params={"max_new_tokens": 2, **params}), [1, 2])


@pytest.mark.parametrize("manager,params", [
    (_manager(), {"n": 2, "temperature": 0.0}),            # greedy: identical completions are right
    (_manager(), {"n": 2, "temperature": 0.5, "top_k": 1}),  # top_k 1 is greedy too
    (_manager(), {"n": 1, "temperature": 0.7}),            # one completion
    (_manager(spec=None), {"n": 2, "temperature": 0.7}),   # no speculation: upstream samples
    (_manager(device="cuda"), {"n": 2, "temperature": 0.7}),  # GPU verify samples
])
def test_sampled_n_is_served_where_it_samples_or_is_greedy(manager, params):
    check_input_ids_in_vocab(manager, _request(sampling_params={"max_new_tokens": 2, **params}), [1, 2])
