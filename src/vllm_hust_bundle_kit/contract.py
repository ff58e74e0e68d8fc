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
# Set by a real `vllm-hust-ext run` on top of what `--dry-run` shows; vLLM logs
# "Unknown vLLM environment variable detected" for each, and for STATE_ENV.
MANAGER_LAUNCH_ONLY_ENVS = (
    "VLLM_ECPA_EVIDENCE_SINK",
    "VLLM_ECPA_EVIDENCE_STRICT",
    "VLLM_ECPA_PLAN_ID",
    "VLLM_ECPA_LAUNCH_ID",
    "VLLM_HUST_EXT_EVIDENCE_PATH",
)
STATE_ENV = "VLLM_HUST_EXT_CONFIG"
# Without STATE_ENV the manager keeps STATE_FILENAME in platformdirs'
# user_config_path(MANAGER_APP_NAME) (on Linux $XDG_CONFIG_HOME, else ~/.config).
MANAGER_APP_NAME = "vllm-hust-ext"
STATE_FILENAME = "config.json"
# Computed by the manager on every launch; a bundle's environment must not set them.
MANAGER_OWNED_ENVS = (PLUGINS_ENV, *ENABLED_BUNDLES_ENVS)

# Carrier implementation statuses; only an `active` one lets the manager enable a bundle.
ACTIVE = "active"
DESCRIPTOR_ONLY = ("import_only", "legacy_unregistered")
