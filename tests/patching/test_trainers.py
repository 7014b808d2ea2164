"""A patched model in the training loops people run: Hugging Face's Trainer and TRL's
SFTTrainer with their defaults (remove_unused_columns on, the trainer's own collator and
loss), ten optimizer steps of four accumulated, padded micro-batches each (so the loss is
a sum divided by num_items_in_batch, the tokens of all four), against the unpatched model
under the same trainer: the step losses within verify's rule (each run's error against a
float64 run of the unpatched model, at most k times the unpatched fp32 run's).

The patched kinds here are the ones a trainer calls into: the causal LM's forward and its
loss (and, for SFTTrainer, whose own fused LM head reads the final norm's output, the
norms). The module kinds run inside model(...) as in any call; each family's are held to
the unpatched model in test_patch.py, where the interpreter's cost is paid once per kind.
"""

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from speedlight.patching import PatchWarning, apply_kinds
from speedlight.spec import TOLERANCES
from speedlight.verify.compare import judge
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import build, vocab

STEPS, ACCUMULATION, BATCH = 10, 4, 2
LOSS_KINDS = dict(rms_norm=False, mlp=False, rope=False, decoder_layer=False, attention=False)
PAD = 0


def _rows(n: int, vocab_size: int) -> list[dict]:
    """Sequences of 3 to 8 tokens (never PAD), their labels, and a text column no model
    takes, which remove_unused_columns must drop."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        length = int(torch.randint(3, 9, (1,), generator=g))
        ids = torch.randint(1, vocab_size, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": ids, "text": "a" * length})
    return rows


def _right_padded(rows: list[dict]) -> dict:
    """The batch a padding collator makes: PAD and attention mask 0 after each sequence,
    label -100 there. Refuses a column the trainer should have removed."""
    assert all(set(r) == {"input_ids", "labels"} for r in rows), rows[0].keys()
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), length), PAD)
    labels = torch.full((len(rows), length), -100)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
        labels[i, :len(r["labels"])] = torch.tensor(r["labels"])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels}


def _arguments(cls, tmp_path, **extra):
    return cls(output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=BATCH,
               gradient_accumulation_steps=ACCUMULATION, learning_rate=1e-2, logging_steps=1,
               report_to="none", save_strategy="no", use_cpu=True, seed=0, data_seed=0,
               disable_tqdm=True, **extra)


def _step_losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _hold_to_verify_rule(ours: list[float], theirs: list[float], truth: list[float]) -> None:
    """verify's rule on the step losses: ours against truth (a float64 run), at most k times
    the error of theirs (the unpatched fp32 run); truth=theirs holds ours to k units of
    roundoff of the unpatched run (the model check's rule for a model with no float64 copy)."""
    assert len(ours) == len(theirs) == len(truth) == STEPS
    check = judge("step losses", torch.tensor(ours), torch.tensor(truth, dtype=torch.float64),
                  torch.tensor(theirs), TOLERANCES[torch.float32])
    assert check.passed, (check.reason, ours, theirs, truth)


def _items_seen(model) -> list:
    """num_items_in_batch of every training forward of model (a pre-hook's record)."""
    seen = []
    model.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs.get("num_items_in_batch")) if model.training
        else None, with_kwargs=True)
    return seen


def test_trainer_with_its_defaults_trains_the_patched_model(tmp_path):
    base = build("llama", seed=5)
    data = datasets.Dataset.from_list(_rows(STEPS * ACCUMULATION * BATCH, vocab(base)))
    runs = {}
    for name, model in (("theirs", copy.deepcopy(base)), ("truth", copy.deepcopy(base).double()),
                        ("ours", copy.deepcopy(base))):
        if name == "ours":
            report = apply_kinds(model, **LOSS_KINDS)
            assert report.count("linear_cross_entropy") == 1 and not report.not_patched
            seen = _items_seen(model)
        trainer = transformers.Trainer(model=model, args=_arguments(
            transformers.TrainingArguments, tmp_path / name), train_dataset=data,
            data_collator=_right_padded)
        assert trainer.args.remove_unused_columns
        counter = LaunchCounter()
        with counter.active():
            trainer.train()
        runs[name] = _step_losses(trainer)
    _hold_to_verify_rule(runs["ours"], runs["theirs"], runs["truth"])
    # the fused loss ran on every micro-batch, each divided by its step's four batches' tokens
    assert counter.kernels.count("_cross_entropy_fwd_kernel") >= STEPS * ACCUMULATION
    assert len(seen) == STEPS * ACCUMULATION and all(torch.is_tensor(n) for n in seen), seen[:4]
    per_step = [int(n) for n in seen[::ACCUMULATION]]
    assert all(seen[i] == seen[i - i % ACCUMULATION] for i in range(len(seen)))
    assert len(set(per_step)) > 1, per_step  # padded batches: the token counts differ


def _tokenizer(vocab_size: int):
    """A word-level tokenizer over the tiny vocabulary, built in code (no download)."""
    from tokenizers import Tokenizer, models
    words = {f"w{i}": i for i in range(vocab_size)}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="w1")),
        pad_token=f"w{PAD}", eos_token="w2")


def test_sft_trainer_with_its_defaults_trains_the_patched_model(tmp_path):
    """SFTTrainer computes its loss with TRL's own fused LM head: it wraps the model's
    forward and calls it with fused_lm_head=True, reading the lm_head's weight and the
    backbone's last hidden state. The patched forward hands such a call to the forward it
    wraps, so the loss is TRL's (speedlight's fused loss does not run), the token accuracy
    TRL logs is there, and the step losses are the unpatched run's. Patched before the
    trainer wraps the forward, and after."""
    base = build("llama", seed=5)
    rows = [{"input_ids": r["input_ids"]} for r in _rows(STEPS * ACCUMULATION * BATCH,
                                                         vocab(base))]
    data = datasets.Dataset.from_list(rows)
    runs, accuracy = {}, {}
    for name in ("theirs", "ours", "ours-after"):
        model = copy.deepcopy(base)
        if name == "ours":
            apply_kinds(model, **LOSS_KINDS)
        trainer = trl.SFTTrainer(model=model, args=_arguments(trl.SFTConfig, tmp_path / name),
                                 train_dataset=data, processing_class=_tokenizer(vocab(base)))
        assert trainer.args.remove_unused_columns
        if name == "ours-after":
            apply_kinds(model, **LOSS_KINDS)
        counter = LaunchCounter()
        with counter.active():
            trainer.train()
        assert counter.kernels == [], counter.kernels  # TRL's head, not speedlight's loss
        runs[name] = _step_losses(trainer)
        accuracy[name] = [h["mean_token_accuracy"] for h in trainer.state.log_history
                          if "loss" in h]
    assert len(runs["theirs"]) == STEPS
    for name in ("ours", "ours-after"):
        assert runs[name] == runs["theirs"] and accuracy[name] == accuracy["theirs"]


def test_a_call_asking_for_trls_fused_head_takes_the_forward_it_wraps():
    """A call with TRL's fused_lm_head keyword goes to the forward the patch wraps (TRL's,
    which computes its own loss from the lm_head's weight), never into speedlight's fused
    loss: on a model TRL has not wrapped, that is the model's own forward, which makes the
    logits."""
    base = build("llama")
    model = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        apply_kinds(model, **LOSS_KINDS)
    ids = torch.randint(1, vocab(model), (2, 5))
    out = model(input_ids=ids, labels=ids, fused_lm_head=True)
    expected = base(input_ids=ids, labels=ids, fused_lm_head=True)
    assert out.logits is not None
    torch.testing.assert_close(out.loss, expected.loss)
