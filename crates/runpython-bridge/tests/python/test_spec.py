"""The bridge spec the host sends, read key by key by the client (`src/client.py`), with plain `python3`.

    python3 -m unittest discover -s crates/runpython-bridge/tests/python -t crates/runpython-bridge/tests/python
"""

import json
import unittest

from test_client import bridge_spec, dumps, load_client, tool_spec


class Spec(unittest.TestCase):
    def test_a_spec_with_a_key_missing_or_unknown_is_refused_naming_it(self):
        client = load_client()
        cases = [
            ({k: v for k, v in bridge_spec([tool_spec()]).items() if k != "max_frame"}, "missing key 'max_frame'"),
            (dict(bridge_spec([tool_spec()]), site=1), "unknown key 'site'"),
            (bridge_spec([dict(tool_spec(), hiden=True)]), "unknown key 'hiden'"),
            (bridge_spec([tool_spec(params=[{"name": "x", "required": True}])]), "missing key 'default'"),
        ]
        for spec, said in cases:
            with self.subTest(said=said):
                with self.assertRaises(client.BridgeError) as caught:
                    client.install(spec, {}, json.loads, dumps)
                self.assertIn(said, str(caught.exception))
