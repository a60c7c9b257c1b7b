"""The Simulator's jobs: stages of the schedule, each job's phases (head-only phases before, its tasks, head-only
phases after), the head's queue (driver code, one phase at a time), task submission (offsets and the concurrency
limit), completion and time budgets.
"""
from __future__ import annotations

from ray_nodeless.simulate.model import JobRun, TaskRun
from ray_nodeless.simulate.nodes import NodeBook


class JobFlow(NodeBook):
    """Jobs moving through their phases as the stages of the schedule start."""

    def _start_stage(self) -> None:
        self.stage_idx += 1
        if self.stage_idx >= len(self.stages):
            self.workload_end = self.now
            return
        for name in self.stages[self.stage_idx]:
            spec = self.trace.jobs[name]
            jr = JobRun(spec=spec)
            self.jobs[name] = jr
            self._at(self.now + spec.delay_ms, "job_start", name)

    def _job_advance(self, name: str) -> None:
        """Move a job to its next phase."""
        jr = self.jobs[name]
        spec = jr.spec
        if jr.state == "waiting":
            jr.state, jr.phase_idx = "before", 0
        if jr.state == "before":
            if self._next_head_phase(name, jr, spec.head_before):
                return
            jr.state = "tasks"
            jr.tasks_start_ms = self.now
            for ts in spec.tasks:
                tr = TaskRun(seq=len(self.tasks), job=name, spec=ts)
                self.tasks.append(tr)
                jr.tasks.append(tr)
            if spec.time_budget_ms is not None:
                self._at(self.now + spec.time_budget_ms, "budget", name)
            self._submit(name)
            if jr.tasks:
                return
        if jr.state == "tasks":
            jr.state, jr.phase_idx = "after", 0
        if jr.state == "after":
            if self._next_head_phase(name, jr, spec.head_after):
                return
            jr.state = "done"
            if all(self.jobs[j].state == "done" for j in self.stages[self.stage_idx]):
                self._start_stage()

    def _next_head_phase(self, name: str, jr: JobRun, phases) -> bool:
        """Queue the job's next head-only phase of `phases` on the head; False when there is none left."""
        if jr.phase_idx >= len(phases):
            return False
        self._head_request(name, phases[jr.phase_idx].duration_ms)
        jr.phase_idx += 1
        return True

    def _submit(self, name: str) -> None:
        """Submit the job's tasks in order, as their offsets come due and the concurrency limit allows."""
        jr = self.jobs[name]
        limit = jr.spec.max_concurrent
        while jr.next_task < len(jr.tasks):
            tr = jr.tasks[jr.next_task]
            due = jr.tasks_start_ms + tr.spec.submit_at_ms
            if due > self.now:
                self._at(due, "submit", name)
                return
            if limit is not None and jr.in_flight >= limit:
                return
            tr.state, tr.submit_ms = "pending", self.now
            self.pending.append(tr)
            jr.in_flight += 1
            jr.next_task += 1
            self._dirty = True

    def _task_phase_over(self, jr: JobRun) -> bool:
        return jr.next_task >= len(jr.tasks) and jr.in_flight == 0

    def _head_request(self, job: str, duration_ms: int) -> None:
        self.head_queue.append((job, duration_ms))
        self._head_next()

    def _head_next(self) -> None:
        if self.head_busy_until is not None or not self.head_queue:
            return
        job, dur = self.head_queue.pop(0)
        self.head_busy_until = self.now + dur
        self.head_phase_ms += dur
        self._at(self.now + dur, "head_done", job)


    def _task_finished(self, tr: TaskRun, state: str) -> None:
        tr.useful_ms += max(0, self.now - tr.start_ms)
        self._release(tr)
        tr.state = state
        jr = self.jobs[tr.job]
        jr.in_flight -= 1
        self._dirty = True
        if jr.state == "tasks":
            self._submit(tr.job)
            if self._task_phase_over(jr):
                self._job_advance(tr.job)

    def _budget(self, name: str) -> None:
        jr = self.jobs[name]
        if jr.state != "tasks":
            return
        for tr in jr.tasks:
            if tr.state == "running":
                tr.useful_ms += max(0, self.now - tr.start_ms)
                self._release(tr)
                tr.state = "cut"
            elif tr.state in ("pending", "waiting"):
                tr.state = "cancelled"
        self.pending = [t for t in self.pending if t.state == "pending"]
        jr.next_task, jr.in_flight = len(jr.tasks), 0
        self._dirty = True
        self._job_advance(name)

