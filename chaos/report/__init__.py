"""Run reports: reports/<run-id>/{result.json, history.jsonl, junit.xml, report.html, logs/}.

    checks + history ──> build_result ──> RunResult ──> write_report ──> result.json, junit.xml,
                                                                          report.html
    reports/<run-id>/ ──> render_report (`kvchaos report DIR`) re-renders from result.json +
                          history.jsonl; several RunResults ──> write_suite ──> suite.json,
                          junit.xml + print_suite (rich table)
"""

from chaos.report.model import RunResult, SuiteResult, XfailInfo
from chaos.report.result import build_result, exit_code
from chaos.report.suite import print_suite, write_suite
from chaos.report.writer import ReportError, render_report, write_report

__all__ = ["ReportError", "RunResult", "SuiteResult", "XfailInfo", "build_result", "exit_code",
           "print_suite", "render_report", "write_report", "write_suite"]
