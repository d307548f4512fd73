"""Starting and supervising the processes: embedded Redis, api, worker, beat."""
