"""Gateway methods (agent, agent.wait, chat.*, sessions.*) as plain functions."""
