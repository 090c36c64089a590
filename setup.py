"""The one thing ``pyproject.toml`` cannot declare without setuptools' experimental table: the
C kernels, each optional (where one cannot be built, e.g. no C compiler, the install goes on
and the Python path, the reference, does the same work with the same bytes):

- the log's batch framer (``src/loglake/log/_framing.c``; why, in its header; the Python
  path: ``loglake.log.record_codec``);
- the sds-audit decoder's batch kernel (``src/loglake/sds/_decode.c``; the Python path:
  ``loglake.sds.columnar``);
- the Cardinal Batch record's Avro decode (``src/loglake/cardinal/_avro.c``; the Python path:
  ``loglake.cardinal.avro.decode_batch_reference``)."""

from setuptools import Extension, setup

KERNELS = {
    "loglake.log._framing": "src/loglake/log/_framing.c",
    "loglake.sds._decode": "src/loglake/sds/_decode.c",
    "loglake.cardinal._avro": "src/loglake/cardinal/_avro.c",
    # archives-build's scan: WakuMessage fields and archive frames of a whole batch; the numpy
    # paths in archives/columnar.py are the reference and the fallback
    "loglake.archives._waku": "src/loglake/archives/_waku.c",
}

setup(
    ext_modules=[
        Extension(name, sources=[source], optional=True, extra_compile_args=["-O2"])
        for name, source in KERNELS.items()
    ]
)
