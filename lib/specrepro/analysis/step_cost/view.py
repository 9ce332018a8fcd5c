"""Notebook 08's tables and figure, built once from the step-cost checks.

Design:
- `StepCostView.build(finding)` runs what the notebook shows, once: the stand-in's cells
  checked (step_cost_check), the overheads fitted on them, the articles' rows checked with
  those overheads (step_cost_articles), the suite's own cells checked with fits of their own
  (step_cost_suite.finding_cells; on the CPU suite the embedded engine's overheads there).
- Each `*_table` method returns a `tables.Table` (frame, caption saying what rows and cells
  are, notes), which `show_table` displays; `roofline` returns the figure. The notebook
  calls these and holds no logic. scripts/step_cost.py prints the same tables as Markdown.
- The medians the issue asks for are computed here and put in the captions, never typed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import polars as pl

from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.finding.tables import Table
from specrepro.analysis.step_cost import articles as arts
from specrepro.analysis.step_cost import check as chk
from specrepro.analysis.step_cost import report as rep
from specrepro.analysis.step_cost.cells import standin_cells
from specrepro.analysis.step_cost.suite import finding_cells

CHECK_COLUMNS = ["card", "engine", "arm", "drafts", "streams", "tokens_per_step", "tok_s",
                 "predicted_tok_s", "error_pct", "step_ms", "predicted_step_ms", "bound",
                 "busy", "fitted", "reason", "source"]


@dataclass
class StepCostView:
    fits: chk.Fits
    standin: pl.DataFrame        # step_cost_check.check over the stand-in's cells
    articles: pl.DataFrame       # step_cost_articles.check_articles
    own: pl.DataFrame            # the suite's own cells, checked
    own_fits: chk.Fits | None
    suite: str

    @classmethod
    def build(cls, finding: Finding | None = None) -> StepCostView:
        cells = standin_cells()
        fits = chk.fit(cells)
        standin = chk.check(cells, fits)
        articles = arts.check_articles(fits)
        own, own_fits = pl.DataFrame(), None
        if finding is not None:
            mine = finding_cells(finding)
            if mine.height:
                own_fits = chk.fit(mine, reference_card=mine["card"][0])
                own = chk.check(mine, own_fits)
        return cls(fits, standin, articles, own, own_fits,
                   finding.suite.name if finding is not None else "")

    # --- the data ---------------------------------------------------------------------

    def cards_table(self) -> Table:
        return Table(rep.cards_table(), "The cards the model prices a step on "
                     "(lib/specrepro/analysis/step_cost/cards.yaml): bandwidth in GB/s "
                     "(decimal), dense peak math in TFLOP/s, each value with its source",
                     (("measured: a measurement in this repository; vendor: the published "
                       "datasheet; derived: arithmetic on those, said how"),))

    def models_table(self) -> Table:
        return Table(rep.models_table(), "The targets and drafters "
                     "(lib/specrepro/analysis/step_cost/models.yaml): GB one pass reads, GFLOP "
                     "a token, KV bytes a context token, how a step runs a drafter (block: "
                     "one pass over 1 + k positions; chain: k passes)")

    def fits_table(self) -> Table:
        frames = [rep.fits_table(self.fits)]
        if self.own_fits is not None and self.own_fits.overheads:
            frames.append(rep.fits_table(self.own_fits))
        notes = () if self.own_fits is None or self.own_fits.overheads else ((
            f"This suite's ({self.suite}) own cells set no fit: none of its one-stream cells "
            "had the device at least 70 % busy, so its cells are predicted with no overhead."),)
        return Table(pl.concat(frames).unique(["card", "engine"], keep="first",
                                              maintain_order=True),
                     "The fitted overheads (ms a step) and the cells each was read from: "
                     "fixed, on the engine's warm one-stream plain steps on that card; "
                     "speculative, on its warm one-stream block-drafter steps on the H200, "
                     "carried to its other cards and to the articles' boxes",
                     (("Nothing else is fitted: bandwidth and peak are the card's measured or "
                       "rated figures, tokens a step the cell's own acceptance."), *notes))

    # --- checked both ways --------------------------------------------------------------

    def standin_table(self, lo: int = 1, hi: int = 32) -> Table:
        s = chk.summary(self.standin, lo, hi)
        frame = self.standin.filter(pl.col("streams").is_between(lo, hi)).select(CHECK_COLUMNS)
        return Table(frame, (
            f"The stand-in's stored cells at {lo}-{hi} streams, measured against the model "
            f"(tok/s, step in ms): median |error| {s['median_abs_error_pct']:.1f} % over "
            f"{s['cells']} cells, {s['predicted_median_abs_error_pct']:.1f} % over the "
            f"{s['predicted_cells']} that set no fit; {s['over_bound']} miss by more than "
            f"{chk.MISS_PCT:.0f} %, each with what was measured about it"),
            (("busy: the GPU's NVML utilization over the cell's window (0-1); bound: whether "
              "the model's step is longer in math or in reads; fitted: the cell set an "
              "overhead (its error is then near 0 by construction)"),))

    def standin_by_engine(self, lo: int = 1, hi: int = 32) -> Table:
        return Table(chk.summary(self.standin, lo, hi)["by"],
                     f"Median |error| on tok/s by card and engine, {lo}-{hi} streams")

    def standin_beyond(self) -> Table:
        s = chk.summary(self.standin, 33, 100_000)
        frame = self.standin.filter(pl.col("streams") > 32).select(CHECK_COLUMNS)
        return Table(frame, f"Beyond 32 streams (not in the issue's bound): median |error| "
                     f"{s['median_abs_error_pct']:.1f} % over {s['cells']} cells")

    def own_table(self) -> Table | None:
        if not self.own.height:
            return None
        s = chk.summary(self.own, 1, 10_000)
        return Table(self.own.select(CHECK_COLUMNS), (
            f"This suite's ({self.suite}) own cells against the model on its card: median "
            f"|error| {s['median_abs_error_pct']:.1f} % over {s['cells']} cells"),
            (("On a CPU the busy share counts the engine's Python host work as busy, so a "
              "step the host sets is not told from a weight read (analysis/verdict/host_bound.py)."),))

    def articles_table(self) -> Table:
        cov = self.articles.filter(pl.col("covered"))
        med = float(cov["error_pct"].abs().median()) if cov.height else float("nan")
        frame = cov.select("article", "label", "workload", "streams", "metric", "published",
                           "predicted", "error_pct", "tokens_per_step", "tokens_source",
                           "predicted_step_ms", "bound", "note")
        return Table(frame, (
            f"Every speed figure the articles publish that the model covers ({cov.height}): "
            "published, predicted on the article's own box (its card's rated figures, its "
            "model bytes, its acceptance; the stand-in's engine overheads), error in %; "
            f"median |error| {med:.0f} %"),
            (("Nothing here is fitted on an article's number: a miss is what the bytes, the "
              "math at the card's dense peak and the stand-in's engine overheads do not "
              "explain on that box."),))

    def uncovered_table(self) -> Table:
        return Table(self.articles.filter(~pl.col("covered")).select(
            "article", "label", "workload", "streams", "metric", "published", "why"),
            "The published speed figures the model does not cover, and why")

    def side_by_side_table(self) -> Table:
        return Table(rep.side_by_side(self.articles, self.standin), (
            "Every covered published speed side by side: the article's number, the model on "
            "the article's box, the stand-in's measurement at the same engine, drafter kind, "
            "drafts and streams (the H200 first), and the model on that card"))

    def floor_table(self) -> Table:
        return Table(rep.floor_table(self.standin, self.articles), (
            "At one stream: the bytes a step reads (the target's weights and every drafter "
            "pass), the floor at the card's rated and at its measured bandwidth, and the step "
            "as a share of each floor's speed"),
            (("The articles' 71-78 % are against rated bandwidth; set the stand-in's rated "
              "column beside them. Stand-in steps are from tok/s and acceptance; vLLM's own "
              "step counter reads a little shorter (8.90 ms for the block drafter, not 9.18)."),))

    def crossover_table(self) -> Table:
        return Table(rep.crossovers(self.standin, self.fits), (
            "Where speculation stops paying: measured (the stand-in's cells, the articles' "
            "figures) and modelled, in streams and in tokens verified a step over the card's "
            "ridge (where the target's math takes as long as its weight read)"))

    def fp8_table(self) -> Table:
        return Table(arts.fp8_drafter_bound(self.fits), (
            "Article B's bound on the FP8 drafter (about 15 % of a step's bytes: at most about "
            "7 % at one stream, close to nothing at 32) against the model: the gain at the "
            "same tokens a step (bytes alone), at each arm's published acceptance, and "
            "published (B's confirmation table)"))

    def misses_table(self, n: int = 5) -> Table:
        return Table(rep.largest_misses(self.articles, n), (
            f"The {n} published figures the model misses most: the step it priced, the step "
            "the article's figure implies at its tokens a step, and the gap a step and a "
            "request"))

    def roofline(self):
        from specrepro.analysis.step_cost.roofline import roofline_chart

        own = self.own if self.own.height else None
        return roofline_chart(rep.roofline_points(self.standin, self.articles, own,
                                                  f"this suite ({self.suite})"))


def step_cost_view(finding: Finding | None = None) -> StepCostView:
    """What notebook 08 shows, built once (`StepCostView.build`)."""
    return StepCostView.build(finding)


@functools.cache
def _shared() -> StepCostView:
    """The stand-in's and the articles' checks, once a process (every speed report reads it)."""
    return StepCostView.build(None)


def speed_rows(article_arms: list[str]) -> Table:
    """A speed report's side-by-side rows: the published speeds of the
    report's own article arms (claims.yaml `arms`), each with the model on the article's box,
    the stand-in's measurement and the model on its card; notebook 08 has every row."""
    from specrepro.published import load_arms

    labels = {r["arm"]: r["label"] for r in load_arms().iter_rows(named=True)}
    wanted = {labels[a] for a in article_arms if a in labels}
    frame = rep.side_by_side(_shared().articles, _shared().standin).filter(
        pl.col("arm").is_in(sorted(wanted)))
    return Table(frame, (
        "This finding's published speeds beside the step-cost model (notebook 08): the "
        "article's tok/s, the model on the article's box, the stand-in's measurement at the "
        "same engine, drafter kind, drafts and streams, and the model on the stand-in's card"),
        (("docs/bench/step-cost-2026-12-07.md says what the misses teach; the substrate "
          "line above gives this suite's floor against rated and measured bandwidth."),))
