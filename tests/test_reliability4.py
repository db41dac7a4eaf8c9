"""Hostile testing of 0.5 (issue: reliability 4): each case here was a traceback, a silent wrong
result or a misleading message there."""

import pytest
import torch

from evo_attention import AttentionGene, Config, EvolvedAttention, TinyTransformer, train_and_evaluate
from evo_attention.genes import canonical_program
from evo_attention.programs import ProgramError
from evo_attention.util.errors import UserError


@pytest.mark.parametrize("call, error, says", [
    (lambda: AttentionGene.vanilla().mutate("0.3"), TypeError, "mutation_rate must be a number"),
    (lambda: AttentionGene.vanilla().crossover("dot|softmax|none|fixed"), TypeError, "other must be an AttentionGene"),
    (lambda: TinyTransformer(Config(), 5), TypeError, "gene must be an AttentionGene"),
    (lambda: EvolvedAttention(32, 0, "dot|softmax|none|fixed"), UserError, "n_heads 0 must be a positive integer"),
    (lambda: EvolvedAttention(32.0, 4, "dot|softmax|none|fixed"), TypeError, "d_model must be a positive integer"),
    (lambda: train_and_evaluate(AttentionGene.vanilla(), Config(data="recall"), "recall"), TypeError,
     "data must be a TaskData"),
])
def test_the_python_api_checks_its_arguments_at_the_front_door(call, error, says):
    with pytest.raises(error, match=says):
        call()


def test_a_model_refuses_ids_without_a_batch_dimension():
    model = TinyTransformer(Config(d_model=16, n_heads=2, n_layers=1, vocab_size=50, max_seq_len=12), "dot|softmax|none|fixed")
    with pytest.raises(UserError, match=r"shape \[batch, time\], not of shape \(5,\)"):
        model(torch.randint(0, 50, (5,)))


@pytest.mark.parametrize("text, says", [
    ("o(" + "neg(" * 300 + "v" + ")" * 301, "nested 301 deep"),
    ("o(add(v,1e400))", "constant '1e400'"),
    ("o(add(v,0x10))", "constant '0x10'"),
])
def test_program_text_is_refused_in_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(ProgramError, match=says):
        canonical_program(text)


def test_gene_fields_are_refused_in_the_users_words():
    with pytest.raises(UserError, match="program False must be a program's text"):
        AttentionGene(program=False)
    with pytest.raises(UserError, match=r"dconv=5 is not a convolution width"):
        AttentionGene.parse("dot|softmax|none|fixed|dconv=5")
