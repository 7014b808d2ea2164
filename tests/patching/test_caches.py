"""speedlight's attention over every cache transformers ships, through its own kernel, in
patched models (each cache geometry against transformers' own mask, model-free:
test_cache_fuzz.py).

- Every patched family: a prefill and a decode step over a static cache whose unwritten
  slots hold NaN give the original's logits within the model check's rule (speedlight's
  attention alone patched, one layer of each kind, two query heads on one key-value head:
  each head is a program of the CPU interpreter, most of these tests' cost).
- Every cache kind (dynamic, static, sliding, hybrid, offloaded on a GPU; quantized where
  a backend is installed): greedy generation gives the original's tokens and logits within
  that rule, through speedlight's kernel, with no fallback to the family's attention in
  the patch report.
- A decode step over a static cache reads nothing on the host, and compiles whole
  (fullgraph) into one graph that serves every step.
"""

import copy
import inspect
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds  # noqa: E402
from speedlight.spec import TOLERANCES  # noqa: E402
from speedlight.verify.compare import judge  # noqa: E402
from speedlight.verify.harness import LaunchCounter  # noqa: E402
from tests.patching.tiny_models import FAMILIES, NEW_FAMILIES, build, vocab  # noqa: E402

TOL = TOLERANCES[torch.float32]
ATTENTION_ONLY = dict(rms_norm=False, mlp=False, rope=False, cross_entropy=False,
                      linear_cross_entropy=False, decoder_layer=False)


def _passes(name, ours, ref64, theirs):
    check = judge(name, ours, ref64, theirs, TOL)
    assert check.passed, check.to_json()

def _pair(family: str, **overrides):
    """The original (eval) and its copy with attention alone patched, and the report."""
    original = build(family, **overrides).eval()
    patched = copy.deepcopy(original)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        report = apply_kinds(patched, **ATTENTION_ONLY)
    return original, patched, report


def _float64(model):
    ref = copy.deepcopy(model).double()
    if hasattr(ref, "set_experts_implementation"):  # grouped_mm takes no float64
        ref.set_experts_implementation("eager")
    return ref


def _logits64(original, tokens, mask):
    """The float64 model's logits [batch, seq, vocab] at each row's tokens, each row run
    alone without its padding (zeros at the padding)."""
    ref, out = _float64(original), None
    with torch.no_grad():
        for b, keep in enumerate(mask.bool()):
            row = ref(input_ids=tokens[b, keep][None]).logits[0]
            out = row.new_zeros(*tokens.shape, row.shape[-1]) if out is None else out
            out[b, keep] = row
    return out


def _fallbacks(report) -> list:
    return [entry for entry in report.not_patched if entry[0].startswith("attention ")]


def _cache_argument(model) -> str:
    """The forward's name for the cache (`cache` from transformers 5.25, `past_key_values`
    before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def _prompt(model, batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    """Token ids in 1..vocab-1 (0 is the pad id the generate tests name)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab(model), (batch, seq), generator=g)


def _one_layer_each(family: str) -> dict:
    """Config overrides keeping one decoder layer of each kind the family has (the
    hybrids keep their sliding and full layers)."""
    from tests.patching.tiny_models import config
    text = config(family).get_text_config()
    types = getattr(text, "layer_types", None)
    if types and len(set(types)) > 1:
        return {}
    stored = types and "layer_types" in vars(text)  # (Falcon-H1 derives its own)
    return {"num_hidden_layers": 1, **({"layer_types": types[:1]} if stored else {})}


SMALL = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1)  # the least GQA


@pytest.mark.parametrize("family", FAMILIES + NEW_FAMILIES)
def test_every_family_prefills_and_decodes_over_a_static_cache(family):
    """Five tokens, then one, over StaticCache(max_cache_len=16), the slots the prefill
    left unwritten in the patched model's cache set to NaN: both steps' logits as the
    original's, judged against the float64 model over all six tokens; no fallback."""
    from transformers import StaticCache
    original, patched, report = _pair(family, **SMALL, **_one_layer_each(family))
    ids = _prompt(original, 1, 6)
    name = _cache_argument(original)
    logits = []
    for model in (original, patched):
        cache = StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            steps = [model(input_ids=ids[:, :5], **{name: cache}).logits]
            if model is patched:
                for layer in cache.layers:
                    if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
                        layer.keys[:, :, 5:] = float("nan")
                        layer.values[:, :, 5:] = float("nan")
            steps.append(model(input_ids=ids[:, 5:], **{name: cache}).logits)
        logits.append(torch.cat(steps, 1))
    with torch.no_grad():
        ref64 = _float64(original)(input_ids=ids).logits
    _passes("logits", logits[1], ref64, logits[0])
    assert _fallbacks(report) == [], report.not_patched


def _generate(model, ids, mask, cache, new: int):
    """Greedy tokens and each step's logits [batch, new, vocab]."""
    kwargs = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                  output_logits=True, return_dict_in_generate=True)
    if isinstance(cache, str):
        kwargs["cache_implementation"] = cache
    else:
        kwargs[_cache_argument(model)] = cache(model)
    out = model.generate(ids, **kwargs)
    return out.sequences, torch.stack(out.logits, 1)


def _offloaded(static: bool):
    def make(model):
        from transformers import DynamicCache, StaticCache
        if static:
            return StaticCache(config=model.config, max_cache_len=16, offloading=True)
        return DynamicCache(config=model.config, offloading=True)
    return make


def _quantized(model):
    from transformers import QuantizedCache
    from transformers.utils import is_hqq_available, is_optimum_quanto_available
    if is_optimum_quanto_available():
        return QuantizedCache(backend="quanto", config=model.config)
    if is_hqq_available():
        return QuantizedCache(backend="hqq", config=model.config)
    pytest.skip("a quantized cache needs optimum-quanto or hqq, neither installed")


KINDS = [  # (kind, family, config overrides, cache: generate's name or a builder, prompt,
    #         padded: the second prompt left-padded by two)
    # (test_signatures.py generates over dynamic and static caches with padded batches,
    # every kind patched)
    ("dynamic", "llama", SMALL, "dynamic", 6, True),
    ("static", "llama", SMALL, "static", 6, False),
    # every layer a sliding window of 4: the static buffer fills in the prefill, then rolls
    ("sliding", "mistral", dict(SMALL, sliding_window=4), "static", 6, True),
    # a sliding layer (window 8) and a full one, the sliding buffer full after the prefill
    # (generate hands the layers the masks it made before the step, keyed by layer type)
    ("hybrid", "gemma2", SMALL, "static", 9, True),
    ("offloaded", "llama", SMALL, _offloaded(static=False), 6, True),
    ("offloaded-static", "llama", SMALL, _offloaded(static=True), 6, False),
    ("quantized", "llama", SMALL, _quantized, 6, True),
]


@pytest.mark.parametrize("kind,family,overrides,cache,seq,padded", [
    pytest.param(*k, id=k[0]) for k in KINDS])
def test_greedy_generation_over_every_cache_kind_matches_the_original(kind, family, overrides,
                                                                       cache, seq, padded):
    """Two prompts, the second left-padded by two or not, two new tokens: the patched
    model's tokens are the original's, each step's logits pass the model check's rule
    against the float64 model, every attention ran speedlight's kernel and none fell back
    to the family's own. Offloaded caches move layers with CUDA streams: on a GPU only."""
    device = torch.device("cpu")
    if kind.startswith("offloaded"):
        if not torch.cuda.is_available():
            pytest.skip("transformers' offloaded caches use CUDA streams (no CPU path)")
        device = torch.device("cuda")
    original, patched, report = _pair(family, **overrides)
    original, patched = original.to(device), patched.to(device)
    ids = _prompt(original, 2, seq).to(device)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    expected, theirs = _generate(original, ids, mask, cache, 2)
    counter = LaunchCounter()
    with counter.active():
        tokens, ours = _generate(patched, ids, mask, cache, 2)
    assert torch.equal(tokens, expected), (tokens[:, seq:], expected[:, seq:])
    full = torch.cat([mask, torch.ones_like(tokens[:, seq:])], 1)
    _passes("logits", ours, _logits64(original, tokens, full)[:, seq - 1:-1], theirs)
    layers = original.config.num_hidden_layers
    assert sum("_attention_fwd_kernel" in k for k in counter.kernels) >= 2 * layers
    assert _fallbacks(report) == [], report.not_patched


class _HostRead(Exception):
    pass


def _refusing_host_reads(monkeypatch):
    """Tensor.item, tolist, nonzero, .cpu(), int/float/bool of a tensor raise until
    monkeypatch.undo() (a host sync on a GPU, a graph break under torch.compile)."""
    def refuse(name):
        def read(*_, **__):
            raise _HostRead(f"Tensor.{name} read a tensor on the host")
        return read
    for name in ("item", "tolist", "nonzero", "cpu", "__int__", "__float__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


def test_a_decode_step_over_a_static_cache_reads_nothing_on_the_host_and_compiles_whole(
        monkeypatch):
    """Two prompts, the second left-padded by two, over StaticCache(max_cache_len=9) with a
    mask over every slot: the prefill eager, one decode step eager with every host read
    refused, two more with the forward compiled with fullgraph=True (one graph for both,
    no break), each step's logits judged against the float64 model, fed the original's
    greedy tokens."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    original, patched, report = _pair("llama", **SMALL, num_hidden_layers=1)
    name, seq, steps = _cache_argument(original), 6, 3
    tokens = _prompt(original, 2, seq)
    mask = torch.zeros(2, seq + steps, dtype=torch.long)
    mask[:, :seq] = 1
    mask[1, :2] = 0
    caches = {m: StaticCache(config=m.config, max_cache_len=seq + steps)
              for m in (original, patched)}
    compiled = torch.compile(patched, fullgraph=True, backend="eager")
    torch._dynamo.reset()
    counters.clear()

    def run(model, cache, new, end):
        """The last logits of `new`, the tokens up to slot `end`; fresh tensors each step,
        as generate's (a slice's strides would change and recompile)."""
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, end - new.shape[1]:end].clone()
        with torch.no_grad():
            return model(input_ids=new.clone(), attention_mask=mask, position_ids=positions,
                         **{name: caches[cache]}).logits[:, -1]

    theirs, ours = [], []
    for i in range(steps + 1):  # the prefill, then a token a step
        end = seq + i
        if i:
            mask[:, end - 1] = 1
        new = tokens[:, -1:] if i else tokens
        theirs.append(run(original, original, new, end))
        if i == 1:
            _refusing_host_reads(monkeypatch)
        ours.append(run(compiled if i > 1 else patched, patched, new, end))
        monkeypatch.undo()
        tokens = torch.cat([tokens, theirs[-1].argmax(-1, keepdim=True)], 1)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], \
        (dict(counters["stats"]), dict(counters["graph_break"]))
    ref64 = _logits64(original, tokens[:, :-1], mask)[:, seq - 1:]
    _passes("logits", torch.stack(ours, 1), ref64, torch.stack(theirs, 1))
    assert _fallbacks(report) == []
