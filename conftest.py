"""Root conftest: load the specledger plugin when the package is not installed.

On the GPU machine the checkout runs from PYTHONPATH without `pip install`, so the
`pytest11` entry point is absent; registering the module here covers that case
without registering it twice where the entry point already did.
"""

from importlib.metadata import entry_points

if not any(ep.value == "specledger.plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["specledger.plugin"]
