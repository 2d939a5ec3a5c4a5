"""The browser tests' fixtures (tests/support/browser.py): one headless Chromium per test module, a tab
per browser context, Django's async-safety check off beside Playwright's loop."""
from ..support.browser import _sync_orm_beside_playwright, browser, open_tab  # noqa: F401
