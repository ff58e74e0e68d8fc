# SPDX-License-Identifier: Apache-2.0
"""Names fixed by the vLLM-HUST extension manager's contract (standard library only)."""

from __future__ import annotations

# Entry-point groups: where the manager finds bundles, and where vLLM finds plugins.
BUNDLE_GROUP = "vllm_hust.extension_bundles"
VLLM_PLUGIN_GROUP = "vllm.general_plugins"

SCHEMA_VERSION = "0.2-experimental"
RENDERED_FILENAME = "vllm-hust-extension-v0.2.json"
# A bundle's package directory holds exactly one of these.
MANIFEST_FILENAMES = ("vllm-hust-extension-v0.3.json", RENDERED_FILENAME)

# What `vllm-hust-ext run` sets to list the enabled bundles; older builds used the second.
ENABLED_BUNDLES_ENVS = ("VLLMHUST_EXT_ENABLED_BUNDLES", "VLLM_HUST_EXT_ENABLED_BUNDLES")
PLUGINS_ENV = "VLLM_PLUGINS"
# General-plugin names the manager always adds to VLLM_PLUGINS (measured: `ascend`).
MANAGER_BUILTIN_PLUGINS = ("ascend",)
# The manager's runtime-evidence variables: a real `vllm-hust-ext run` with a bundle
# enabled sets them on top of what `--dry-run` shows, and refuses to start (exit 2)
# while the caller's environment holds any of them, even empty. vLLM logs
# "Unknown vLLM environment variable detected" for each, and for STATE_ENV.
RUNTIME_EVIDENCE_ENVS = (
    "VLLM_ECPA_EVIDENCE_SINK",
    "VLLM_ECPA_EVIDENCE_STRICT",
    "VLLM_ECPA_PLAN_ID",
    "VLLM_ECPA_LAUNCH_ID",
    "VLLM_HUST_EXT_EVIDENCE_PATH",
)
MANAGER_LAUNCH_ONLY_ENVS = RUNTIME_EVIDENCE_ENVS
STATE_ENV = "VLLM_HUST_EXT_CONFIG"
# Without STATE_ENV the manager keeps STATE_FILENAME in platformdirs'
# user_config_path(MANAGER_APP_NAME) (on Linux $XDG_CONFIG_HOME, else ~/.config).
MANAGER_APP_NAME = "vllm-hust-ext"
STATE_FILENAME = "config.json"
# The state file's formats: schema_version 2 (an `extensions` object of entries),
# and 1, the legacy `enabled` list the manager still reads (and rewrites as 2).
STATE_SCHEMA_VERSION, LEGACY_STATE_SCHEMA_VERSION = 2, 1
# The keys of a schema-2 entry; any other key makes the manager refuse the file.
STATE_ENTRY_KEYS = ("enabled", "configuration")
# Keys of an entry's `configuration` (set by `vllm-hust-ext extension configure`) that
# the manager reads for a vLLM bundle, and the `launch_options` it knows: JSON-object
# options and on/off flags. Any other launch option makes `run` exit 2.
CONFIGURED_ENVIRONMENT, CONFIGURED_HOST_VERSION = "environment", "host_version"
CONFIGURED_PROTOCOL_VERSIONS, CONFIGURED_LAUNCH_OPTIONS = "protocol_versions", "launch_options"
JSON_LAUNCH_OPTIONS = ("batch_admission_policy_config", "speculative_config")
FLAG_LAUNCH_OPTIONS = ("scheduler_reserve_output_budget",)
# Computed by the manager on every launch; a bundle's environment must not set them.
MANAGER_OWNED_ENVS = (PLUGINS_ENV, *ENABLED_BUNDLES_ENVS)

# Carrier implementation statuses; only an `active` one lets the manager enable a bundle.
ACTIVE = "active"
DESCRIPTOR_ONLY = ("import_only", "legacy_unregistered")
