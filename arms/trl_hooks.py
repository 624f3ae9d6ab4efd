"""The TRL glue of the arms that add terms to GRPO's loss (papo, evi_po): the only code that touches
GRPOTrainer internals. Imports torch and trl: loaded by the arms' trainer modules only.

papo and evi_po add terms to GRPO's loss; they never copy its private loss code (TRL deleted
its own PAPO trainer for that). Three private points are used, each once, here, each tagged
NOTE(trl-1.16) and pinned by tests/unit/test_trl_contract.py:
  1. `_generate_and_score_completions` is wrapped: the arm adds keys to a NEW dict after TRL built the
     generation batch (per-row tensors or lists, so TRL's shuffle/split of the buffer keeps them aligned).
  2. `_get_per_token_logps_and_entropies` is wrapped: inside compute_loss it records the policy log-probs
     of TRL's own forward, so the extra terms reuse that forward and its graph (no second policy pass).
  3. `_get_per_token_logps_and_entropies` is called to score the same token ids under other pixels (TRL's
     chunking, multimodal slicing and fused log-softmax; not re-implemented).

  4. `_prepare_inputs` is wrapped: after TRL shuffled the round's rows and split them into micro-batches
     (`_buffered_inputs`), each micro-batch gets the totals over its optimizer step's accumulation window of the
     counts the arm names in `window_totals` (which rows landed in which window is known only after the shuffle).

A fifth private point is SFTTrainer's token counter (`sft_token_count` below).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer


def loss_mask(inputs: dict):
    """The tokens TRL's losses count (GRPO's and the distillation trainer's): (completion_mask, times tool_mask when
    present: a tool call's output tokens are masked out), float. (B, T)"""
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    return mask.float()


def row_images(example: dict) -> list:
    """The PIL images of one dataset example, as TRL reads them (`images` list or a single `image`)."""
    if example.get("images"):
        return list(example["images"])
    return [example["image"]] if example.get("image") is not None else []


class ExtraTermsGRPOTrainer(GRPOTrainer):
    """GRPOTrainer + hooks for arms that add terms to its loss (subclasses: arms.papo, arms.evi_po).

    Subclasses implement `score_generation(inputs, batch) -> dict` (once per generation batch: extra
    per-row keys, no gradient) and `extra_loss(model, inputs, logp) -> tensor` (per micro-batch, added to
    TRL's loss; `logp` (B, T) are the policy log-probs of TRL's own forward, with gradient). With
    `extra_loss_enabled` False, compute_loss is TRL's, untouched.
    """

    extra_loss_enabled = True
    # {key: per-row key}: each training micro-batch's `key` becomes the number of rows with a nonzero `per-row key`
    # in its optimizer step's accumulation window, over all ranks (see _prepare_inputs)
    window_totals: dict[str, str] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._captured_logps: list | None = None

    # -- what subclasses fill

    def score_generation(self, inputs: list[dict], batch: dict) -> dict:
        return {}

    def extra_loss(self, model, inputs: dict, logp):
        return None

    # -- the private hooks (each used here only)

    def _generate_and_score_completions(self, inputs):
        # NOTE(trl-1.16): private hook 1. TRL builds the generation batch (prompt/completion ids and masks,
        # advantages, pixel_values, image_grid_thw, mm_token_type_ids, num_images, num_items_in_batch) and
        # then shuffles, splits and buffers it; with num_iterations > 1 the buffer is reused, so the arm's
        # keys go into a new dict and TRL's tensors are never written to.
        if len(inputs) != self.generation_round.local_completions:
            raise RuntimeError(f"TRL generated {len(inputs)} completions on this rank, the harness's generation "
                               f"round has {self.generation_round.local_completions}: the TRL mapping "
                               "(harness.rounds) no longer matches TRL; run tests/unit/test_trl_contract.py")
        batch = super()._generate_and_score_completions(inputs)
        return {**batch, **self.score_generation(inputs, batch)}

    def _prepare_inputs(self, generation_batch):
        # NOTE(trl-1.16): private hook 4. On a new round TRL generates, shuffles the round's rows (all its
        # prompts' completions mixed), splits them into steps_per_generation micro-batches (TRL's count: the
        # harness's steps x accumulation) and buffers them; micro-batch i is trained in optimizer step
        # i // accumulation of the round. A window's share of a count is known only after that shuffle.
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self.window_totals and self._buffered_inputs is not before:
            self._count_windows(self._buffered_inputs)
        return inputs

    def _count_windows(self, chunks: list[dict]) -> None:
        """Write each window's totals (over ranks) into its micro-batches: `window_totals`' keys."""
        ga = self.args.gradient_accumulation_steps
        for key, per_row in self.window_totals.items():
            if per_row not in chunks[0]:
                continue
            local = torch.stack([(c[per_row] != 0).sum().float() for c in chunks]).to(self.accelerator.device)
            counts = self.accelerator.gather(local).view(-1, len(chunks)).sum(0)  # (micro-batches,) over ranks
            for i, c in enumerate(chunks):
                w = i // ga
                c[key] = counts[w * ga:(w + 1) * ga].sum()

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # NOTE(trl-1.16): private hook 2. _compute_loss calls this exactly once for the policy log-probs
        # (contract test); while compute_loss runs, the result is recorded for extra_loss.
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._captured_logps is not None:
            self._captured_logps.append(out[0])
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self.extra_loss_enabled:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._captured_logps = []
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            captured = self._captured_logps
        finally:
            self._captured_logps = None
        if len(captured) != 1:
            raise RuntimeError(f"TRL's GRPO loss ran {len(captured)} policy forwards, the arm expects exactly 1: "
                               "the TRL internals changed; run tests/unit/test_trl_contract.py")
        extra = self.extra_loss(model, inputs, captured[0])
        return loss if extra is None else loss + extra

    def trl_logps(self, model, input_ids, attention_mask, logits_to_keep: int, **forward_kwargs):
        """Per-token log-probs (N, logits_to_keep) of the last tokens of input_ids, via TRL's helper."""
        # NOTE(trl-1.16): private helper 3, called with the keyword arguments _compute_loss passes.
        logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep,
            batch_size=self.args.per_device_train_batch_size, **forward_kwargs)
        return logps

    # -- multimodal bookkeeping of a (micro-)batch

    def require_grid_layout(self, batch: dict) -> None:
        if "image_grid_thw" not in batch or "pixel_values" not in batch:
            raise NotImplementedError(
                f"{type(self).__name__} re-scores completions under other images and supports "
                "Qwen-VL style inputs (pixel_values + image_grid_thw); the batch has "
                f"{sorted(k for k in batch if 'pixel' in k or 'image' in k)}. Use a Qwen2/2.5/3-VL model.")

    def image_ranges(self, batch: dict) -> list[range]:
        """Per row: the indices of its images in image_grid_thw."""
        starts = [0]
        for n in batch["num_images"]:
            starts.append(starts[-1] + n)
        return [range(a, b) for a, b in zip(starts[:-1], starts[1:])]

    def pixels_per_row(self, batch: dict, pixel_values) -> list:
        """Split pixel_values (sum of patches, D) into one tensor per row (its images' patches)."""
        per_image = batch["image_grid_thw"].prod(-1).tolist()
        per_row = [sum(per_image[i] for i in r) for r in self.image_ranges(batch)]
        return list(torch.split(pixel_values, per_row, dim=0))

    def pixels_like(self, batch: dict, images_per_row: list[list], rows: list[int] | None = None):
        """Process replacement PIL images for `rows` (default: all) of the batch; they must give the same
        image grid as the originals, so every prompt id stays valid. An image object repeated across rows
        (the G completions of one prompt) is processed once."""
        self.require_grid_layout(batch)
        rows = list(range(len(images_per_row))) if rows is None else rows
        flat = [img for imgs in images_per_row for img in imgs]
        unique = list({id(img): img for img in flat}.values())
        out = self.processing_class.image_processor(images=unique, return_tensors="pt")
        grid = out["image_grid_thw"]  # (U, 3)
        pieces = dict(zip((id(img) for img in unique), torch.split(out["pixel_values"], grid.prod(-1).tolist())))
        ranges = self.image_ranges(batch)
        want = batch["image_grid_thw"][[i for r in rows for i in ranges[r]]]
        index = {id(img): j for j, img in enumerate(unique)}
        got = grid[[index[id(img)] for img in flat]]
        if got.shape != want.shape or not torch.equal(got.to(want.device), want):
            raise ValueError(f"replacement images give image grids {got.tolist()}, the prompts were built for "
                             f"{want.tolist()}: a replacement image must have its original's size")
        return torch.cat([pieces[id(img)] for img in flat]).to(self.accelerator.device)

    def score_completions(self, model, batch: dict, *, pixel_values, rows: list[int] | None = None):
        """Log-probs (len(rows), T) of the batch's sampled completion tokens under other pixel_values."""
        self.require_grid_layout(batch)
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, P+T)
        attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, P+T)
        ranges = self.image_ranges(batch)
        rows = list(range(ids.size(0))) if rows is None else rows
        fw = {"image_grid_thw": batch["image_grid_thw"][[i for r in rows for i in ranges[r]]],
              "num_images": [len(ranges[r]) for r in rows]}
        for key in ("mm_token_type_ids", "token_type_ids"):
            if key in batch:
                fw[key] = batch[key][rows]
        return self.trl_logps(model, ids[rows], attn[rows], batch["completion_ids"].size(1),
                              pixel_values=pixel_values, **fw)

    @staticmethod
    def loss_mask(inputs: dict):
        """TRL's loss mask (completion_mask, times tool_mask when present), float. (B, T)"""
        return loss_mask(inputs)

    # -- normalization: the extra terms scale like TRL's loss

    def _window_normalizer(self, total):
        """TRL's dapo normalizer: `total` (gathered over ranks, whole generation batch) per rank, times the
        share of the generation batch one optimizer step's accumulation window holds."""
        normalizer = total.clamp(min=1.0) / self.accelerator.num_processes
        if self.model.training:
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normalizer

    def token_term_scale(self, mask, total_tokens):
        """Multiplier of a micro-batch token mean (over `mask`) so it sums like TRL's loss over the window:
        dapo/cispo/vespo: sum(mask * x) / TRL's normalizer; other loss types: mean / accumulation steps."""
        if self.loss_type in ("dapo", "cispo", "vespo"):
            return mask.sum() / self._window_normalizer(total_tokens)
        return 1.0 / (self.current_gradient_accumulation_steps if self.model.training else 1.0)

    def window_scale(self, count, window_total):
        """Multiplier of a micro-batch mean over `count` items so the window sums to a mean over its items;
        `window_total`: the items of this micro-batch's window over all ranks (a `window_totals` key; in eval,
        where a batch is neither split nor accumulated, the batch's)."""
        return count / (window_total.clamp(min=1.0) / self.accelerator.num_processes)

    def gather_sum(self, value):
        """Sum of a local count over ranks (every rank must call it: a collective)."""
        t = torch.as_tensor(value, dtype=torch.float32, device=self.accelerator.device).reshape(1)
        return self.accelerator.gather(t).sum()

    def log_sums(self, named: dict) -> None:
        """Log name -> (sum, count) as the ratio of the sums over ranks (NaN when the count is 0: TRL's log
        drops it). One collective per call; callers pass the same names on every rank."""
        if not named:
            return
        mode = "train" if self.model.training else "eval"
        names = sorted(named)
        dev = self.accelerator.device
        scalar = lambda v: torch.as_tensor(v, dtype=torch.float32, device=dev).reshape(())  # noqa: E731
        local = torch.stack([torch.stack([scalar(named[n][0]), scalar(named[n][1])]) for n in names])  # (K, 2)
        totals = self.accelerator.reduce(local, reduction="sum").tolist()
        for name, (s, c) in zip(names, totals):
            self._metrics[mode][name].append(s / c if c > 0 else float("nan"))


# NOTE(trl-1.16): SFTTrainer logs num_tokens from an attribute (_total_train_tokens) that its checkpoints do
# not save, so a resumed run logged the tokens of the new process only (976 instead of 2928 at step 3): the
# sft arm saves it with the harness's checkpoint totals and restores it (tests/integration/test_resume.py,
# bitwise resume; tests/unit/test_trl_contract.py pins the attribute).
SFT_TOKEN_COUNTER = "_total_train_tokens"


def sft_token_count(trainer) -> int:
    return getattr(trainer, SFT_TOKEN_COUNTER)


def set_sft_token_count(trainer, n: int) -> None:
    setattr(trainer, SFT_TOKEN_COUNTER, n)
