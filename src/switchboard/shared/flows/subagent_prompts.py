"""What a spawned sub-agent is told: its task message and its system prompt (reference §7.4)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ChildBrief:
    """Everything the child prompts mention."""

    task: str
    child_key: str
    requester_key: str
    requester_channel: str | None
    depth: int
    max_depth: int
    label: str | None = None
    persistent: bool = False

    @property
    def can_spawn(self) -> bool:
        """An orchestrator (below the depth limit) may spawn children of its own."""
        return self.depth < self.max_depth


def child_task_message(brief: ChildBrief) -> str:
    """The user message that starts the child run."""
    parts = [
        f"[Subagent Context] You are running as a subagent (depth {brief.depth}/"
        f"{brief.max_depth}). Results auto-announce to your requester; do not busy-poll "
        "for status."
    ]
    if brief.persistent:
        parts.append(
            "[Subagent Context] This subagent session is persistent and remains available "
            "for thread follow-up messages."
        )
    parts.append(f"[Subagent Task]: {brief.task}")
    return "\n\n".join(parts)


def child_system_prompt(brief: ChildBrief) -> str:
    """The extra system prompt of the child run (markdown)."""
    parent = "the main agent" if brief.depth <= 1 else "a parent orchestrator"
    task = _WHITESPACE.sub(" ", brief.task).strip()
    sections = [
        "# Subagent Context",
        f"You are a **subagent** spawned by {parent} for a specific task.",
        "## Your Role\n"
        f"- You were created to handle: {task}\n"
        "- Complete this task. That's your entire purpose.\n"
        f"- You are NOT {parent}. Don't try to be.",
        "## Rules\n"
        "1. **Stay focused** - Do your assigned task, nothing else.\n"
        "2. **Complete the task** - Your final message is automatically announced to your "
        "requester as the Result.\n"
        "3. **Don't initiate** - No proactive actions, no side quests.\n"
        "4. **Be ephemeral** - This session may be archived or deleted after the task.\n"
        "5. **Trust push-based completion** - Do not busy-poll for status.",
        "## Output Format\n"
        "When complete, your final response should include:\n"
        "- What you accomplished or found\n"
        "- Any relevant details your requester should know\n"
        "- Keep it concise but informative\n"
        "Reply with exactly ANNOUNCE_SKIP if nothing should be announced.",
        "## What You DON'T Do\n"
        "- NO user conversations (that's your requester's job)\n"
        "- NO external messages unless the task names a recipient\n"
        "- NO pretending to be your requester",
        _spawning_section(brief),
        _session_context(brief),
    ]
    return "\n\n".join(s for s in sections if s)


def _spawning_section(brief: ChildBrief) -> str:
    if brief.can_spawn:
        return (
            "## Sub-Agent Spawning\n"
            "You CAN spawn your own sub-agents for parallel or complex work using "
            "`sessions_spawn`. Their results are announced back to you automatically; "
            "wait for them instead of polling, then give your final answer."
        )
    if brief.depth >= 2:
        return (
            "## Sub-Agent Spawning\n"
            "You are a leaf worker and CANNOT spawn further sub-agents. Do the work yourself."
        )
    return ""


def _session_context(brief: ChildBrief) -> str:
    lines = ["## Session Context"]
    if brief.label:
        lines.append(f"- Label: {brief.label}")
    lines.append(f"- Requester session: {brief.requester_key}.")
    if brief.requester_channel:
        lines.append(f"- Requester channel: {brief.requester_channel}.")
    lines.append(f"- Your session: {brief.child_key}.")
    return "\n".join(lines)
