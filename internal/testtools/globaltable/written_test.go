package globaltable

import (
	"slices"
	"testing"
)

// TestWritten checks which items each write request names, TransactWriteItems
// included, which dynalite does not implement (so no test can send one).
func TestWritten(t *testing.T) {
	for _, c := range []struct {
		op, body string
		want     []itemKey
	}{
		{"UpdateItem", `{"TableName":"t","Key":{"pk":{"S":"a"}},"UpdateExpression":"ADD #c :one"}`, []itemKey{{"t", "a"}}},
		{"PutItem", `{"TableName":"t","Item":{"pk":{"S":"b"},"v":{"N":"1"}}}`, []itemKey{{"t", "b"}}},
		{"DeleteItem", `{"TableName":"t","Key":{"pk":{"S":"c"}}}`, []itemKey{{"t", "c"}}},
		{"BatchWriteItem", `{"RequestItems":{"t":[{"PutRequest":{"Item":{"pk":{"S":"d"}}}},{"DeleteRequest":{"Key":{"pk":{"S":"e"}}}}]}}`,
			[]itemKey{{"t", "d"}, {"t", "e"}}},
		{"TransactWriteItems", `{"TransactItems":[
			{"Put":{"TableName":"t","Item":{"pk":{"S":"f"}}}},
			{"Update":{"TableName":"u","Key":{"pk":{"S":"g"}}}},
			{"Delete":{"TableName":"t","Key":{"pk":{"S":"h"}}}},
			{"ConditionCheck":{"TableName":"t","Key":{"pk":{"S":"i"}}}}]}`,
			[]itemKey{{"t", "f"}, {"t", "h"}, {"u", "g"}}}, // sorted
		{"GetItem", `{"TableName":"t","Key":{"pk":{"S":"j"}}}`, nil},
		{"UpdateItem", `{"TableName":"t","Key":{"pk":{"N":"1"}}}`, nil}, // not hotcount's key
		{"PutItem", `{not json`, nil},
	} {
		got := written(c.op, []byte(c.body))
		slices.SortFunc(got, compareKeys)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %s: written = %v, want %v", c.op, c.body, got, c.want)
		}
	}
}
