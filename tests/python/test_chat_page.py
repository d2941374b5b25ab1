"""The chat page at `/` in a real browser: headless Chromium (Debian's
`chromium` and `chromium-driver`) driven by selenium types a message and
watches the streamed reply, the live panel and the serial comparison."""

import os
import shutil
import urllib.request
from pathlib import Path

import pytest


def browser_or_skip():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        message = "headless Chromium is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("TENSORFOLD_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860"]:
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture()
def page(server):
    browser = browser_or_skip()
    browser.get(server + "/")
    yield browser
    browser.quit()


def test_page_is_served_with_its_assets(server):
    html = urllib.request.urlopen(server + "/").read().decode()
    assert "<title>TensorFold chat</title>" in html
    for asset, kind in [("/chat.js", "javascript"), ("/chat.css", "css")]:
        response = urllib.request.urlopen(server + asset)
        assert kind in response.headers["content-type"]
        assert len(response.read()) > 500


def test_a_typed_message_streams_a_reply_identical_to_serial(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(page, 120)
    wait.until(lambda p: "test-model" in p.find_element(By.ID, "model").text)
    page.find_element(By.ID, "compare").click()
    page.find_element(By.ID, "input").send_keys("Name the capital of France.", Keys.ENTER)

    reply = wait.until(lambda p: p.find_element(By.CSS_SELECTOR, ".message.assistant[data-done=true]"))
    text = reply.find_element(By.CLASS_NAME, "content").text
    assert "Paris" in text, text
    assert int(page.find_element(By.ID, "tokens").text) > 0
    assert float(page.find_element(By.ID, "tps").text) > 0
    assert " / " in page.find_element(By.ID, "drafts").text
    assert "MiB" in page.find_element(By.ID, "memory").text

    verdict = wait.until(lambda p: reply.find_element(By.CLASS_NAME, "verdict"))
    assert "identical" in verdict.text and "same" in verdict.get_attribute("class"), verdict.text

    shot = os.environ.get("TENSORFOLD_CHAT_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(shot)
