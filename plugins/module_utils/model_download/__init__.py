"""The model_download role as code: resolve a Hub revision, list, fetch with the `hf` CLI, verify, link, prune.

    files    pure decisions: file selection, sizes, the record and the completion marker, link and prune plans,
             the sha256 manifest, the disk check, hf's argv and environment, the failure messages
    node     what runs on the node (imported by the module model_download_node): directories, the old layout,
             hf in the foreground or in the background, probes, hard links, hashing, pruning
    wait     the controller's wait for a background download, with progress lines and a time bound

The action plugin plugins/action/model_download.py strings them together; the role's tasks are its table of
contents. Nothing here imports Ansible: every error is a ModelDownloadError whose text says what, why and the fix.
"""
