# SPDX-License-Identifier: Apache-2.0
"""Where this package's Spark2_5 support comes from (PROVENANCE.md tells the story).

Standard library only, like the toolkit's ``switch``: safe to import from any process.
"""

# The vLLM commit the public Spark2_5 plugin vendored its model, config and
# parser from. The code here was written anew; this pins the behaviour it follows.
UPSTREAM_VLLM_COMMIT = "81efe7883f30582696b69f9b9ea93c4819a8c608"
# The public plugin (GitHub owner/name) and its license.
UPSTREAM_PLUGIN_REPOSITORY = "XHToken/Spark-plugin"
UPSTREAM_LICENSE = "Apache-2.0"
