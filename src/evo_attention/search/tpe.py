"""TPE: Optuna's Tree-structured Parzen Estimator (multivariate) behind the ask/tell interface.

Optuna is optional (``pip install 'evo-attention[tpe]'``). The study lives in memory only: a resumed
run rebuilds it by replay, and the sampler (seeded) sees the same trials in the same order, so it
asks exactly what the interrupted one would have.

- Each gene field with more than one option is one categorical parameter (``gene_from_params`` is
  the one place where trial parameters become a gene).
- Generation 0 is the strategy's own ``_initial_genes`` (the GA's generation 0 for the same seed;
  ``warm_start`` genes are enqueued as the study's first trials), added to the study when told; later
  generations ask the sampler for batches of ``population_size - elite_size``. Several objectives
  make it the multi-objective TPE; failures are told ``inf`` in every objective.
- ``dedupe`` (on): a proposal that repeats a key asked before (or in its batch) is told failed and
  asked again; after ``DEDUPE_TRIES`` the slot gets a gene drawn among those not asked yet.
- Constraints (a run with caps): every trial carries its excess over each cap as an Optuna
  constraint, set on the trial (Optuna 5 on) or read by a ``constraints_func`` from its user
  attribute ``constraints``.
"""

from __future__ import annotations

import warnings
from typing import Any

from evo_attention.genes import ALL_FIELDS, AttentionGene, SearchSpace, violation
from evo_attention.search.base import Strategy, draw_new_gene
from evo_attention.search.random_search import RandomSearch
from evo_attention.train.config import as_bool
from evo_attention.util.errors import UserError

DEDUPE_TRIES = 20
INSTALL_HINT = "pip install 'evo-attention[tpe]' (or pip install optuna)"


def import_optuna(setting: str = "strategy"):
    """The optuna module, or a one-line ``UserError`` saying how to install it for ``setting`` (strategy
    tpe, or optuna_journal)."""
    try:
        import optuna
    except ImportError:
        what, instead = ("strategy tpe", ", or choose another strategy") if setting == "strategy" else (setting, "")
        raise UserError(f"{what} needs Optuna, which is not installed: {INSTALL_HINT}{instead}",
                        setting=setting) from None
    return optuna


def gene_from_params(params: dict[str, Any], space: SearchSpace) -> AttentionGene | None:
    """The gene of a trial's parameters (the fields it does not name take their only option); None
    when the combination breaks a validity rule of genes.RULES (the trial is then failed and TPE
    asks again)."""
    values = {name: params[name] if name in params else space.options(name)[0] for name in ALL_FIELDS}
    return None if violation(values) else AttentionGene(gene_dict=values)


def sets_constraints(optuna) -> bool:
    """Whether this Optuna sets constraints on a trial (``Trial.set_constraint``, 5.0 on)."""
    return hasattr(optuna.trial.Trial, "set_constraint")


def _constraints_of(trial) -> tuple:
    """The ``constraints_func`` of an Optuna without ``Trial.set_constraint``: the trial's excess over
    each cap, kept in its user attribute ``constraints``."""
    return tuple(trial.user_attrs.get("constraints", ()))


def constraint_attrs(names, values, *, named: bool = False) -> dict:
    """The keyword arguments of ``optuna.trial.create_trial`` that give a finished trial its
    constraints (``values``, one per cap ``names``; none for None): the user attribute
    ``constraints`` (with ``constraint_names``) and the constraints Optuna's samplers and
    optuna-dashboard read: by name (``create_trial(constraints=...)``, Optuna 5 on) when ``named``,
    else the system attribute ``constraints`` holding the values in order, which every Optuna
    version reads."""
    if values is None:
        return {}
    attrs = {"user_attrs": {"constraints": list(values), "constraint_names": list(names)}}
    if named:
        attrs["constraints"] = {name: float(v) for name, v in zip(names, values)}
    else:
        attrs["system_attrs"] = {"constraints": tuple(float(v) for v in values)}
    return attrs


class TPE(RandomSearch):
    """Optuna's multivariate TPE sampler, asked in the GA's batch sizes, with random search's
    bookkeeping (everything evaluated, ranked; each batch its history)."""

    name = "tpe"
    OPTIONS = {**Strategy.OPTIONS, "n_ei_candidates": 24, "dedupe": True}

    def __init__(self, *, n_ei_candidates: int = 24, dedupe: bool = True, **batches):
        super().__init__(**batches)
        optuna = import_optuna()
        from optuna.distributions import CategoricalDistribution

        self.n_ei_candidates = int(n_ei_candidates)
        if self.n_ei_candidates < 1:
            raise UserError(f"n_ei_candidates {n_ei_candidates!r} must be a positive integer", setting="n_ei_candidates")
        self.dedupe = as_bool("dedupe", dedupe)
        self._optuna = optuna
        if self.space.layers:
            raise UserError("strategy tpe samples one gene shared by every layer: use genome shared, or ga, nsga2 or "
                            "random for per-layer genomes", setting="genome")
        if self.space.program_space is not None:
            raise UserError("strategy tpe samples categorical options and cannot encode programs: use ga, random, "
                            "neighbours, nsga2 or climb for a program search space", setting="strategy")
        self.distributions = {name: CategoricalDistribution(self.space.options(name)) for name in ALL_FIELDS
                              if len(self.space.options(name)) > 1}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # how constraints reach the sampler: set on each trial (Optuna 5 on), else a constraints_func
        self._set_constraints = bool(self.constraints) and sets_constraints(optuna)
        extra = {"constraints_func": _constraints_of} if self.constraints and not self._set_constraints else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is marked experimental
            sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=0,
                                                 n_ei_candidates=self.n_ei_candidates, seed=self.seed % 2**32, **extra)
        self.study = optuna.create_study(directions=["minimize"] * self.n_objectives, sampler=sampler)
        self._trials: list = []  # the open trial of each asked gene (None: added to the study when told)

    # -- ask/tell hooks ---------------------------------------------------------------------------
    def _propose(self) -> list[AttentionGene]:
        if self.generation == 0:
            genes = self._initial_genes()
            warm = {g.key for g in self._warm}
            self._trials = [self._enqueued(g) if g.key in warm else None for g in genes]
            return genes
        genes, self._trials, taken = [], [], set(self._asked_keys)
        for _ in range(self.batch_size(self.generation)):
            gene, trial = self._ask_one(taken)
            genes.append(gene)
            self._trials.append(trial)
            taken.add(gene.key)
        return genes

    def _ask_one(self, taken: set[str]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(DEDUPE_TRIES):
                trial = self.study.ask(self.distributions)
                gene = gene_from_params(trial.params, self.space)
                if gene is not None and (not self.dedupe or gene.key not in taken):
                    return gene, trial
                # a repeat, or a combination a validity rule forbids: failed, so TPE learns to avoid it
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            gene = draw_new_gene(self.rng, self.space, taken)
            self.study.enqueue_trial(self._params(gene))
            trial = self.study.ask(self.distributions)
            return gene_from_params(trial.params, self.space), trial

    def _enqueued(self, gene):
        """The open trial of a warm-start gene, asked through ``enqueue_trial`` (None if its fields
        are not all options of the space: it is then added when told, like a random gene)."""
        params = self._params(gene)
        if params is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.enqueue_trial(params)
            return self.study.ask(self.distributions)

    def _constraint_values(self, gene) -> list[float] | None:
        """The gene's excess over each cap of the run, in the order of ``constraints`` (0 where
        unknown); None for an unconstrained run."""
        if not self.constraints:
            return None
        excess = self.excess_of(gene)
        if set(excess) == {"total"}:  # told as one number: the first constraint carries it
            return [float(excess["total"])] + [0.0] * (len(self.constraints) - 1)
        return [float(excess.get(name, 0.0)) for name in self.constraints]

    def _update(self, told):
        for (gene, fitness), trial in zip(told, self._trials):
            values = list(fitness) if isinstance(fitness, tuple) else [fitness]  # finite or inf (Strategy.tell)
            constraints = self._constraint_values(gene)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if trial is not None:
                    if constraints is not None:
                        trial.set_user_attr("constraints", constraints)
                        if self._set_constraints:
                            for name, value in zip(self.constraints, constraints):
                                trial.set_constraint(name, value)
                    self.study.tell(trial, values)
                else:
                    params = self._params(gene)
                    if params is not None:
                        self.study.add_trial(self._optuna.trial.create_trial(
                            params=params, distributions=self.distributions, values=values,
                            **constraint_attrs(self.constraints, constraints, named=self._set_constraints)))
        self._trials = []
        super()._update(told)

    def _params(self, gene: AttentionGene) -> dict | None:
        """The trial parameters of ``gene``; None if a field's value is not an option of the space."""
        values = gene.to_dict()
        if any(values[name] not in dist.choices for name, dist in self.distributions.items()):
            return None
        if any(len(self.space.options(name)) == 1 and values[name] != self.space.options(name)[0]
               for name in ALL_FIELDS):
            return None
        return {name: values[name] for name in self.distributions}
