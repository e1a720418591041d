"""Stage adv_rm@i: a natural/generated discriminator on policy i-1's trunk, trained on data/adv/cycle_i (the recipe:
speedrun.adversarial.train_disc). About ten seconds on CPU: it keeps no resume state."""
import dataclasses
import time

from speedrun.adversarial.train_disc import train_discriminator
from speedrun.common import pick_device, use_bf16
from speedrun.stage import run_stage

READS = ("seed", "compute.device", "compute.dtype", "adversarial.cycles.{cycle}", "adversarial.rm")
PATHS = {"init_dir": None, "data_dir": "data/adv/cycle_{cycle}", "tokenizer_dir": "outs/tokenizer",
         "out_dir": "outs/adv/cycle_{cycle}/disc"}
IDS = {"cycle": str}  # run ids: the DVC foreach/matrix keys


def main(p, io, cycle: str) -> None:
    t0 = time.perf_counter()
    device = pick_device(p.compute.device)
    cfg = dataclasses.replace(p.adversarial.rm, bf16=use_bf16(p.compute.dtype, device), monitor="val_loss")
    init_dir = io.init_dir or p.adversarial.cycles[cycle].init
    m = train_discriminator(init_dir, io.data_dir, io.tokenizer_dir, cfg, cycle, p.seed, device, io.out_dir)
    print(f"adv_rm@{cycle}: val MAE of K/N {m['mae_k_frac']:.3f} "
          f"(predicting the mean: {m['mae_k_frac_baseline']:.3f}), "
          f"AUC pure natural vs generated {m['auc_pure']}, switch error {m['switch_error_tokens']:.1f} tokens, "
          f"{m['steps']} steps in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS, IDS)
