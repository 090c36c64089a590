"""The one thing ``pyproject.toml`` cannot declare without setuptools' experimental table: the
log's batch framer in C (``src/loglake/log/_framing.c``; why, in its header). Optional: where
it cannot be built (no C compiler), the install goes on and the log frames records in Python,
the same bytes (``loglake.log.record_codec``)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loglake.log._framing",
            sources=["src/loglake/log/_framing.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        # archives-build's scan: WakuMessage fields and archive frames of a whole batch
        # (src/loglake/archives/_waku.c); the numpy paths in archives/columnar.py are the
        # reference and the fallback
        Extension(
            "loglake.archives._waku",
            sources=["src/loglake/archives/_waku.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
