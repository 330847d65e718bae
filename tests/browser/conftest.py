"""Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, against a live server."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCREENSHOTS = ROOT / "var" / "screenshots"
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
            "--window-size=1400,1000",
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


def screenshot(driver, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
