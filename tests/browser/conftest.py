"""Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, against a live server."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parent.parent.parent
SCREENSHOTS = ROOT / "var" / "screenshots"
# The docs' screenshots (docs/screenshots/): written by the browser tests, so they show the console as it is.
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
# The tallest page a docs screenshot shows whole (the dashboard's charts are below the fold).
MAX_SCREENSHOT_HEIGHT = 4200
# Every browser's window, and what a full-page docs screenshot goes back to.
WINDOW_SIZE = (1400, 1000)
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _browser_available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


@pytest.fixture
def browser_factory():
    if not _browser_available():
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are required in CI (.ci/run installs them)")
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers = []

    def make(language: str = "en-US"):
        profile = tempfile.mkdtemp(prefix="rc-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size={},{}".format(*WINDOW_SIZE),
            f"--user-data-dir={profile}",
            f"--lang={language}",
        ):
            options.add_argument(argument)
        options.add_experimental_option("prefs", {"intl.accept_languages": language})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.implicitly_wait(0)
        drivers.append((driver, profile))
        return driver

    yield make
    for driver, profile in drivers:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, name: str, folder: Path = SCREENSHOTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def docs_screenshot(driver, name: str) -> Path:
    """A screenshot of the whole page (up to MAX_SCREENSHOT_HEIGHT) for the docs, in docs/screenshots/."""
    width = driver.execute_script("return window.outerWidth")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(height + 140, MAX_SCREENSHOT_HEIGHT))
    path = screenshot(driver, name, DOCS_SCREENSHOTS)
    driver.set_window_size(*WINDOW_SIZE)
    return path


# Every browser test's users have this password.
PASSWORD = "browser-test-password-1"


def log_in(driver, live_server, username: str) -> None:
    driver.get(f"{live_server.url}/admin/login/?next=/admin/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(driver, 15).until(EC.presence_of_element_located((By.ID, "user-tools")))
