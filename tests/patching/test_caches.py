"""speedlight's attention over every cache transformers ships, through its own kernel.

- Cache geometries, model-free: a cache layer of each kind (none, dynamic, static, their
  sliding-window forms before, while and after the window fills and the static buffer
  rolls) takes its past and then a step of queries, padded or not; the mask builder and
  the attention function get what transformers gives them, and every query that is a token
  matches float64 attention over the keys transformers' own SDPA mask lets it see (taken
  by selection), while the slots no query may see hold NaN. A padding mask that is not
  one run of tokens per row, or a description made for another step, is an error naming
  the mask.
- Every patched family: a prefill and a two-token continuation over a static cache whose
  unwritten slots hold NaN give the original's logits within the model check's rule.
- Every cache kind (dynamic, static, sliding, hybrid, offloaded; quantized where a backend
  is installed): greedy generation of a left-padded batch gives the original's tokens and
  logits within that rule, through speedlight's kernel, with no fallback to the family's
  attention in the patch report.
- A decode step over a static cache reads nothing on the host, and compiles whole
  (fullgraph) into one graph that serves every step.
"""

import copy
import inspect
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight import reference  # noqa: E402
from speedlight.patching import PatchWarning, apply_kinds  # noqa: E402
from speedlight.patching.hf_attention import attention_forward, padding_mask  # noqa: E402
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


# --- cache geometries, model-free ---------------------------------------------------------

HEADS, KV_HEADS, DIM, WINDOW, MAX_LEN = 2, 1, 16, 4, 12


def _layer(kind: str):
    from transformers import cache_utils as cu
    return {"dynamic": lambda: cu.DynamicLayer(),
            "static": lambda: cu.StaticLayer(max_cache_len=MAX_LEN),
            "dynamic-sliding": lambda: cu.DynamicSlidingWindowLayer(sliding_window=WINDOW),
            "static-sliding": lambda: cu.StaticSlidingWindowLayer(max_cache_len=MAX_LEN,
                                                                 sliding_window=WINDOW),
            }[kind]()


class _Layer(torch.nn.Module):
    is_causal = True


def _padding(batch: int, length: int, padding: str) -> torch.Tensor | None:
    """A 2-D mask over `length` positions: row 1 left-padded by 2, or right-padded by 2
    (a prefill), or with a hole (not a padding mask); "ones": nothing padded, said so."""
    if padding == "none":
        return None
    mask = torch.ones(batch, length, dtype=torch.long)
    if padding == "left":
        mask[-1, :2] = 0
    elif padding == "right":
        mask[-1, -2:] = 0
    elif padding == "hole":
        mask[-1, 1] = 0
    elif padding == "empty-row":
        mask[-1] = 0
    return mask


def _visible_by_sdpa(kind, batch, q_length, kv_length, q_offset, kv_offset, mask):
    """transformers' own SDPA mask of the call: bool [batch, q_length, kv_length]."""
    from transformers import masking_utils as mu
    function = (mu.sliding_window_causal_mask_function(WINDOW) if "sliding" in kind
                else mu.causal_mask_function)
    four = mu.sdpa_mask(batch_size=batch, q_length=q_length, kv_length=kv_length,
                        q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                        attention_mask=None if mask is None else mask.bool(),
                        allow_is_causal_skip=False, device=torch.device("cpu"))
    return four.expand(batch, 1, q_length, kv_length)[:, 0]


def _by_selection(q, k, v, visible, scale):
    """o [batch, q_length, heads, dim]: each query row over the keys it sees, selected
    (speedlight.reference.attention, no mask); zeros for a row that sees none."""
    o = q.new_zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    for b in range(q.shape[0]):
        for r in range(q.shape[2]):
            keys = visible[b, r].nonzero().flatten()
            if len(keys):
                o[b, r] = reference.attention(q[b:b + 1, :, r:r + 1], k[b:b + 1, :, keys],
                                              v[b:b + 1, :, keys], scale=scale)[0, :, 0]
    return o


GEOMETRIES = [  # (cache kind, past tokens, queries, padding, batch)
    ("none", 0, 6, "none", 2), ("none", 0, 6, "left", 2), ("none", 0, 6, "right", 2),
    ("none", 0, 6, "empty-row", 2), ("dynamic", 4, 1, "none", 2), ("dynamic", 4, 3, "left", 2),
    ("static", 0, 5, "none", 2), ("static", 0, 5, "left", 1), ("static", 0, 5, "right", 2),
    ("static", 5, 1, "none", 2), ("static", 5, 1, "left", 2), ("static", 5, 3, "ones", 2),
    ("dynamic-sliding", 0, 6, "left", 2), ("dynamic-sliding", 6, 1, "left", 2),
    ("dynamic-sliding", 6, 2, "none", 1), ("static-sliding", 2, 1, "none", 1),
    ("static-sliding", 2, 1, "left", 2),
    ("static-sliding", 3, 2, "none", 2), ("static-sliding", 6, 1, "left", 2),
    ("static-sliding", 5, 3, "none", 1),
]


def _cache_step(kind, past, q_length, padding, batch, seed=0):
    """A cache layer of `kind` fed `past` tokens, then the sizes transformers hands the mask
    builder for q_length more (taken before the update, as a model's forward does), the
    keys and values the update returns, and which of their slots no query may see."""
    from transformers.cache_utils import Cache
    g = torch.Generator().manual_seed(seed)

    def states(n):
        return (torch.randn(batch, KV_HEADS, n, DIM, generator=g),
                torch.randn(batch, KV_HEADS, n, DIM, generator=g))

    cache = Cache(layers=[_layer(kind)]) if kind != "none" else None
    if cache is not None and past:
        cache.update(*states(past), 0)
    if cache is None:
        q_offset, (kv_length, kv_offset) = 0, (q_length, 0)
    else:
        q_offset, (kv_length, kv_offset) = (cache.get_query_offset(0),
                                            cache.get_mask_sizes(q_length, 0))
    mask = _padding(batch, past + q_length, padding)
    if padding == "ones":
        mask = torch.ones(batch, past + q_length, dtype=torch.long)
    sizes = dict(batch_size=batch, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                 kv_offset=kv_offset)
    ours = padding_mask(**sizes, attention_mask=None if mask is None else mask.bool())
    visible = _visible_by_sdpa(kind, batch, q_length, kv_length, q_offset, kv_offset, mask)
    k, v = states(q_length) if cache is None else cache.update(*states(q_length), 0)
    q = torch.randn(batch, HEADS, q_length, DIM, generator=g)
    return q, k, v, ours, visible, mask


@pytest.mark.parametrize("kind,past,q_length,padding,batch", [
    pytest.param(*g, id="-".join(map(str, g))) for g in GEOMETRIES])
def test_every_query_sees_the_keys_transformers_mask_shows_it(kind, past, q_length, padding,
                                                              batch):
    q, k, v, slots, visible, mask = _cache_step(kind, past, q_length, padding, batch)
    assert k.shape[2] == visible.shape[2]  # the mask's key length is the buffer's
    hidden = ~visible.any(1)  # key slots no query sees: unwritten, padding, out of window
    poisoned = [t.clone().masked_fill(hidden[:, None, :, None], float("nan")) for t in (k, v)]
    scale = DIM ** -0.5
    window = WINDOW if "sliding" in kind else None
    counter = LaunchCounter()
    with counter.active():
        o, _ = attention_forward(_Layer(), q, *poisoned, slots, scaling=scale,
                                 sliding_window=window)
    assert any("_attention_" in name for name in counter.kernels)
    # the queries that are tokens (a padded query's output is not defined)
    tokens = torch.ones(batch, q_length, dtype=torch.bool) if mask is None \
        else mask[:, -q_length:].bool()
    ref64 = _by_selection(*(t.double() for t in (q, k, v)), visible, scale)
    theirs = _by_selection(q, k, v, visible, scale)
    _passes("o", o[tokens], ref64[tokens], theirs[tokens])


def test_a_mask_that_is_not_one_run_per_row_is_refused():
    with pytest.raises(RuntimeError, match="padding mask"):
        _cache_step("static", 5, 1, "hole", 2)


def test_a_description_made_for_another_step_is_refused():
    q, k, v, slots, _, _ = _cache_step("static", 5, 1, "left", 2)
    with pytest.raises(ValueError, match="attention_mask .*another step"):
        padding_mask(batch_size=2, q_length=2, kv_length=MAX_LEN, attention_mask=slots)
    with pytest.raises(ValueError, match="3 queries and 12 keys"):
        attention_forward(_Layer(), torch.cat([q] * 3, 2), k, v, slots)


# --- models ---------------------------------------------------------------------------------

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


# two query heads sharing one key-value head: the smallest GQA (each head is one program
# of the CPU interpreter, most of these tests' cost)
SMALL = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1)


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
