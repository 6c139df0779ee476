"""The installed names: ``epp`` (with ``plugins/`` as ``epp.plugins``) and the simulator ``bench/sim/`` as ``epp_sim``.

The repository keeps its top-level ``plugins/`` and ``bench/`` folders; nothing named ``plugins`` or ``bench`` lands in
site-packages, and the benchmarks other than the simulator are not installed (run them from a checkout).
"""

from setuptools import find_packages, setup


def _mapped(name: str, where: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(where)]


setup(
    packages=find_packages(include=["epp", "epp.*"]) + _mapped("epp.plugins", "plugins") + _mapped("epp_sim", "bench/sim"),
    package_dir={"epp.plugins": "plugins", "epp_sim": "bench/sim"},
)
