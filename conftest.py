"""Root conftest: load the specledger plugin when the package is not installed.

On the GPU machine the checkout runs from PYTHONPATH without `pip install`, so the
`pytest11` entry point is absent; registering the module here covers that case
without registering it twice where the entry point already did.
"""

from importlib.metadata import entry_points

# pytester: the plugin's own tests run inner pytest sessions in process (tests/test_plugin.py). Declared here
# because pytest takes `pytest_plugins` only from the rootdir's conftest.
pytest_plugins = ["pytester"]
if not any(ep.value == "specledger.plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins.append("specledger.plugin")
