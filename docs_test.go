package pipeline_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocs checks the README and the pages under docs/ against the repository: the
// README stays a guide (at most 250 lines), every relative link leads to a file of the
// repository (a user's clone has nothing else), and every Example a page names exists,
// so that each page's runnable code is compiled and run by go test.
func TestDocs(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	assert.LessOrEqual(t, strings.Count(string(readme), "\n"), 250, "README.md: a guide read in ten minutes")

	examples := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Example\w*)\(\)`)
	require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
				examples[m[1]] = true
			}
		}
		return nil
	}))

	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	named := regexp.MustCompile("`(Example\\w*)`")
	for _, page := range append(pages, "README.md", "bench/README.md") {
		src, err := os.ReadFile(page)
		require.NoError(t, err)
		text := string(src)
		assert.NotContains(t, text, "../shared", "%s: a file outside the repository", page)
		assert.NotContains(t, text, "scenarios.md", "%s: a file outside the repository", page)
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			_, err := os.Stat(filepath.Join(filepath.Dir(page), target))
			assert.False(t, os.IsNotExist(err), "%s links to %s, which is not in the repository", page, target)
		}
		if filepath.Dir(page) != "docs" || page == "docs/contributing.md" {
			continue
		}
		ms := named.FindAllStringSubmatch(text, -1)
		assert.NotEmpty(t, ms, "%s names no Example: its code is not compiled by any test", page)
		for _, m := range ms {
			assert.True(t, examples[m[1]], "%s names %s, which no test file declares", page, m[1])
		}
	}
}
