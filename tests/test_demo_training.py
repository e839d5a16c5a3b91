"""The demo model's training drills (tools/): the next-token-only step trains exactly the AR term of the full
objective, family weights and short answers change only what is drawn, and short answers are still right.

The training code needs torch (a test dependency); the skill generator does not."""
import random

import pytest

from tools import demo_oracle, demo_skills
from test_parity import require_reference


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
