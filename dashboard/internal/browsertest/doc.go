// Package browsertest tests the dashboard's page in a real browser: headless Chromium
// driven with chromedp, loading the page while a pipeline runs: one of the test's own
// (TestBrowser), the main job examples/etl (TestBrowserETL) and examples/outage
// (TestBrowserOutage), each built with its own module and run as a user runs it. It is
// a module of its own so that chromedp is no dependency of the pipeline module; it
// holds only tests.
//
// The tests need Chromium at /usr/bin/chromium (Debian's chromium package, which
// scripts/test.sh installs when it is missing). Without it they are skipped, or fail
// when CI=true. Each saves a screenshot of the page in its artifact folder (go test
// -artifacts), and also in $DASHBOARD_SCREENSHOTS when that is set: the README's
// pictures, docs/dashboard.png (the main job) and docs/outage.png, are made with
//
//	DASHBOARD_SCREENSHOTS=$PWD/../../../docs go test -run 'BrowserETL|BrowserOutage' -count=1 .
package browsertest
