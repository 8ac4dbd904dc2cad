"""Package set-up read from settings.ini (the nbdev 2 layout)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).with_name("settings.ini"))
c = cfg["DEFAULT"]

readme = Path(__file__).with_name("README.md")
setuptools.setup(
    name=c["lib_name"].replace("_", "-"),
    version=c["version"],
    description=c["description"],
    long_description=readme.read_text(encoding="utf-8") if readme.exists() else "",
    long_description_content_type="text/markdown",
    author=c["author"],
    author_email=c["author_email"],
    license="Apache-2.0",
    packages=setuptools.find_packages(include=[c["lib_path"], c["lib_path"] + ".*"]),
    include_package_data=True,
    package_data={c["lib_path"]: ["data/*.json"]},
    python_requires=">=" + c["min_python"],
    install_requires=c.get("requirements", "").split(),
    extras_require={"dev": c.get("dev_requirements", "").split(),
                    "embedded": ["gguf>=0.10"], "peft": ["peft>=0.10"]},
    entry_points={"console_scripts": c.get("console_scripts", "").split(),
                  "nbdev": [f"{c['lib_path']}={c['lib_path']}._modidx:d"]},
    zip_safe=False,
)
