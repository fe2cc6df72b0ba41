// Package browsertest tests the dashboard's page in a real browser: headless Chromium
// driven with chromedp, loading the page while a pipeline runs. It is a module of its
// own so that chromedp is no dependency of the pipeline module; it holds only tests.
//
// The test needs Chromium at /usr/bin/chromium (Debian's chromium package, which
// scripts/test.sh installs when it is missing). Without it the test is skipped, or
// fails when CI=true. It saves a screenshot of the page in its artifact folder (go test
// -artifacts), and also at $DASHBOARD_SCREENSHOT when that is set:
//
//	DASHBOARD_SCREENSHOT=$PWD/../../docs/dashboard.png go test -run Browser -count=1 .
package browsertest
