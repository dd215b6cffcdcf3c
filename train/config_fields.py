"""Metadata keys of the typed settings' dataclass fields, read by the config loader (`train/config/typed.py`).
A module of its own, importing nothing, so that the loader does not import the classes that use them (the
learner's) and they do not import the loader.

    fp32_head: bool = field(default=False, metadata={DERIVED_FROM: "model.fp32_lm_head"})
"""

# a field whose metadata has this key is not a setting of its own: the run sets it from the setting the value
# names (the config loader refuses it as a key and leaves it out of a run's config.yaml)
DERIVED_FROM = "derived_from"
# a dataclass field whose own fields are keys of the section that holds it (rl.stare.w, not rl.algo.stare.w), in
# the loader, the saved config and the key listings
INLINE = "inline"
