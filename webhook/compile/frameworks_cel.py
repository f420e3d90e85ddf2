"""Which framework knobs go into the GPU container, in CEL (``frameworks._goes_in``): the
image reference normalised as ``framework_images`` does, its globs, versions declared by the
policy (static) or read from TensorFlow's official tags (a pattern of the versions below the
knob's first release), and the share the knobs get."""

from __future__ import annotations

from webhook.compile import cel
from webhook.compile.pod_cel import V, s
from webhook.core import (
    DEFAULT_IMAGES,
    JAX,
    JAX_FRACTION,
    JAX_NEW_FRACTION_VAR,
    JAX_PREALLOCATE,
    TENSORFLOW,
    TF_GROWTH,
    FrameworkImages,
    Knob,
    Policy,
    PolicySet,
    Pool,
    image_version,
    parse_version,
)


class FrameworksCel:
    """Variables img .. pinned (the image), envn, tfin, jf, jfin, jpin, sh."""

    policy: Policy
    policies: PolicySet
    pools: tuple[Pool, ...]

    def add(self, name: str, expression: str) -> None:
        raise NotImplementedError

    def _frameworks(self) -> None:
        """Image facts, which knobs go in (``frameworks._goes_in``), and the share."""
        add, policy = self.add, self.policy
        add("img", f"has({V}c.image) ? {V}c.image : ''")
        registry = r"^(docker\.io|index\.docker\.io|registry-1\.docker\.io)/"
        add(
            "norm0",
            f"{V}img.matches({s(registry)}) ? {V}img.substring({V}img.indexOf('/') + 1) : {V}img",
        )
        add(
            "norm",
            f"{V}norm0.startsWith('library/') ? {V}norm0.substring(8) : {V}norm0",
        )
        add("ref", f"{V}norm.split('@')[0]")
        add(
            "tag0",
            f"{V}ref.lastIndexOf(':') < 0 ? '' : {V}ref.substring({V}ref.lastIndexOf(':') + 1)",
        )
        add("tag", f"{V}tag0.contains('/') ? '' : {V}tag0")
        add(
            "repo",
            f"{V}tag == '' ? {V}ref : {V}ref.substring(0, {V}ref.lastIndexOf(':'))",
        )
        add("pinned", f"{V}repo + ':' + {V}tag")
        add("envn", f"has({V}c.env) ? {V}c.env.map(e, e.name) : []")
        frameworks = policy.frameworks
        tf, jax = frameworks.tensorflow, frameworks.jax
        add("tfin", self._goes_in(TF_GROWTH, tf) if tf.allow_growth else "false")
        jax_in = self._goes_in(JAX_FRACTION, jax) if jax.memory_fraction else "false"
        add("jf", jax_in)
        add(
            "jfin",
            f"{V}jf && !({s(JAX_NEW_FRACTION_VAR)} in {V}envn)",
        )
        add(
            "jpin",
            self._goes_in(JAX_PREALLOCATE, jax) if jax.preallocate is not None else "false",
        )
        headrooms = []
        for pool in self.pools:
            headroom = policy.headroom.as_fraction(pool.gpu_memory_mib)
            headrooms.append(cel.double(headroom or 0.0))
        add(
            "sh",
            f"int(({V}fx - [{', '.join(headrooms)}][{V}pi]) * 1000.0 + {cel.EPSILON})",
        )

    def _goes_in(self, knob: Knob, section: FrameworkImages) -> str:
        framework = knob.framework
        globs = DEFAULT_IMAGES[framework] if section.images is None else section.images
        matched = "true" if self.policy.frameworks.all_containers else self._image_in(globs)
        # Declared versions come first (framework_images.image_version): static answers.
        decision = self._tag_decision(knob)
        for glob, text in reversed(section.versions):
            version = parse_version(text)
            verdict = "true" if version is None or version >= knob.since else "false"
            if version is None and knob.breaks_older:
                verdict = "false"
            decision = f"({self._image_in((glob,))} ? {verdict} : {decision})"
        return f"{matched} && {decision}"

    def _image_in(self, globs: tuple[str, ...]) -> str:
        """``framework_images.matches``: a glob matches the image as written, normalised or
        pinned. A glob matches only references holding its longest literal piece, so a
        ``contains`` test on the image as written comes first: for the images of no
        framework it spares the normalisation (six CEL variables) and three regex tests."""
        regex = s(cel.globs_regex(globs))
        forms = (
            f"({V}img.matches({regex}) || {V}norm.matches({regex}) || {V}pinned.matches({regex}))"
        )
        pieces = [cel.glob_piece(glob) for glob in globs]
        if not all(pieces):
            return forms
        guard = " || ".join(f"{V}img.contains({s(piece)})" for piece in dict.fromkeys(pieces))
        return f"(({guard}) && {forms})"

    def _tag_decision(self, knob: Knob) -> str:
        """Whether a version read from the tag lets the knob in; only TensorFlow's official
        image carries one among the knobs compiled (JAX images do not, and the PyTorch key is
        refused)."""
        if knob.framework == TENSORFLOW:
            sample = image_version(TENSORFLOW, "tensorflow/tensorflow:1.0.0")
            assert sample.version is not None  # the official repository reads tags
            # On the image as written, not its normalised parts: the official repository
            # with a tag, and that tag below the knob's release.
            official = "tensorflow/tensorflow"
            tagged = s(cel.official_tagged_regex(official))
            below = s(cel.official_repository_regex(official, cel.version_below_regex(knob.since)))
            return f"!({V}img.matches({below}) && {V}img.matches({tagged}))"
        assert knob.framework == JAX
        return "true"


# The gpu-fraction-num-devices annotation (a share on several GPUs) is not compiled; pods
# carrying it are refused with this sentence.
