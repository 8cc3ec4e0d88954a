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


def _pool_manager(context_len, max_req_input_len, page_size=None, resolved_page=64):
    sa = SimpleNamespace(device="cuda", speculative_algorithm=None, page_size=page_size,
                         resolved_dict=lambda: {"page_size": resolved_page})
    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB), server_args=sa, context_len=context_len,
                           max_req_input_len=max_req_input_len)


def test_request_the_pool_can_never_admit_is_refused():
    """Pool 1,600 < context 4,096 (upstream: max_req_input_len 1,594), page 64 resolved by a model rule: the
    scheduler needs prompt + new + a page to fit the pool, else the request would wait forever."""
    tm = _pool_manager(4096, 1594)
    fits = [1] * (1600 - 64 - 8)  # exactly fills the pool with 8 new tokens and a page
    check_input_ids_in_vocab(tm, _request(sampling_params={"max_new_tokens": 8}), fits)
    with pytest.raises(ValueError, match=r"the KV pool holds 1600 tokens and the request needs 1529 prompt \+ 8 new "
                                         r"tokens \+ one page of 64"):
        check_input_ids_in_vocab(tm, _request(sampling_params={"max_new_tokens": 8}), fits + [1])
    with pytest.raises(ValueError, match=r"needs 1000 prompt \+ 128 new"):  # upstream's default max_new_tokens
        check_input_ids_in_vocab(_pool_manager(4096, 994), _request(sampling_params={}), [1] * 1000)


def test_pool_check_only_where_the_pool_bounds_a_request():
    # the context, not the pool, bounds requests (pool >= context): upstream's own length checks apply
    check_input_ids_in_vocab(_pool_manager(4096, 4090), _request(sampling_params={"max_new_tokens": 90}), [1] * 4000)
    # an explicit --page-size is used as given
    check_input_ids_in_vocab(_pool_manager(4096, 1594, page_size=1), _request(sampling_params={"max_new_tokens": 4}),
                             [1] * 1595)
