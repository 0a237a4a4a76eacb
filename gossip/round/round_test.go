package round

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1e9, 0)

func TestRecipients(t *testing.T) {
	for _, tc := range []struct {
		name    string
		domains [][]string
		want    []string
	}{
		{"no domain", nil, nil},
		{"one domain", [][]string{{"a", "b"}}, []string{"a", "b"}},
		{"a member in two domains is sent once", [][]string{{"c", "d"}, {"a", "c"}}, []string{"a", "c", "d"}},
		{"empty domains", [][]string{{}, {}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Recipients(tc.domains); !slices.Equal(got, tc.want) {
				t.Errorf("Recipients(%v) = %v, want %v", tc.domains, got, tc.want)
			}
		})
	}
}

func TestBucketRefill(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Bucket
		now  time.Time
		want float64
	}{
		{"the first refill fills it", Bucket{Rate: 1000, Tokens: -5}, t0, 1000},
		{"a second's worth at most", Bucket{Rate: 1000, Tokens: 900, At: t0}, t0.Add(time.Second), 1000},
		{"the budget's bytes since the last", Bucket{Rate: 1000, Tokens: 100, At: t0}, t0.Add(200 * time.Millisecond), 300},
		{"a debt is paid back first", Bucket{Rate: 1000, Tokens: -1500, At: t0}, t0.Add(time.Second), -500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			b.Refill(tc.now)
			if b.Tokens != tc.want || !b.At.Equal(tc.now) {
				t.Errorf("tokens %v at %v, want %v at %v", b.Tokens, b.At, tc.want, tc.now)
			}
		})
	}
}

// TestPlanRound pins a round's plan: who is sent the record, what becomes of the deltas,
// who is sent the residency, and what is left of the budget.
func TestPlanRound(t *testing.T) {
	synced, unsynced := Member{Synced: true}, Member{}
	fresh := Member{Synced: true, RecordAt: t0.Add(-100 * time.Millisecond)}
	old := Member{Synced: true, RecordAt: t0.Add(-time.Second)}
	bucket := func(tokens float64) Bucket { return Bucket{Rate: 1000, Tokens: tokens, At: t0} }
	round := func(tokens float64, members ...Member) Round {
		return Round{Now: t0, Interval: 500 * time.Millisecond, Members: members, Budget: bucket(tokens), RecordEvery: time.Second}
	}
	with := func(r Round, f func(*Round)) Round { f(&r); return r }
	deltas := func(n, bytes int) func(*Round) { return func(r *Round) { r.Deltas, r.DeltaBytes = n, bytes } }
	records := func(cost, next int) func(*Round) { return func(r *Round) { r.Record, r.RecordNext = cost, next } }
	for _, tc := range []struct {
		name string
		in   Round
		want Plan
	}{
		{"no members: nothing", with(round(1000), deltas(1, 100)), Plan{Budget: bucket(1000)}},
		{"nothing pending: nothing", round(1000, synced, synced), Plan{Budget: bucket(1000)}},
		{"deltas go to every member", with(round(1000, synced, synced, synced), deltas(2, 150)),
			Plan{Deltas: DeltasSend, Budget: bucket(550)}},
		{"a member not synced is also sent the residency", with(round(1000, synced, unsynced, synced), deltas(1, 100)),
			Plan{Deltas: DeltasSend, Resync: []int{1}, Budget: bucket(700)}},
		{"a round may overdraw the bucket up to two seconds' worth", with(round(10, synced, synced), deltas(2, 1000)),
			Plan{Deltas: DeltasSend, Budget: bucket(-1990)}},
		{"in debt the deltas wait", with(round(0, synced, unsynced), deltas(1, 100)),
			Plan{Deltas: DeltasWait, Resync: []int{1}, Budget: bucket(0)}},
		{"past two seconds' worth they are dropped and everyone resynced", with(round(10, synced, synced), deltas(3, 1001)),
			Plan{Deltas: DeltasDrop, Resync: []int{0, 1}, Budget: bucket(10)}},
		{"records to synced members due one, within half the budget", with(round(1000, fresh, old, unsynced, old, old), records(100, 0)),
			Plan{Records: []int{1, 3}, RecordNext: 4, Resync: []int{2}, Budget: bucket(800)}},
		{"records go on from where the last round stopped", with(round(1000, old, old, old, old), records(100, 3)),
			Plan{Records: []int{3, 0}, RecordNext: 1, Budget: bucket(800)}},
		{"at least one record a round", with(round(1000, old, old), records(600, 0)),
			Plan{Records: []int{0}, RecordNext: 1, Budget: bucket(400)}},
		{"records go whatever the debt, deltas wait", with(with(round(-50, old, old), records(100, 0)), deltas(1, 100)),
			Plan{Records: []int{0, 1}, RecordNext: 2, Deltas: DeltasWait, Budget: bucket(-250)}},
		{"records and deltas share the budget", with(with(round(300, old, old), records(100, 0)), deltas(1, 100)),
			Plan{Records: []int{0, 1}, RecordNext: 2, Deltas: DeltasSend, Budget: bucket(-100)}},
		{"no record when none goes straight", with(round(1000, old, old), records(0, 1)),
			Plan{RecordNext: 1, Budget: bucket(1000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PlanRound(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("PlanRound =\n%+v, want\n%+v", got, tc.want)
			}
		})
	}
}

// TestPlanSync pins how far a residency goes: to the members in order while the bucket is not
// in debt, and to none, all counted synced, past what a round may cost.
func TestPlanSync(t *testing.T) {
	bucket := func(tokens float64) Bucket { return Bucket{Rate: 1000, Tokens: tokens, At: t0} }
	for _, tc := range []struct {
		name    string
		b       Bucket
		cost, n int
		want    SyncPlan
	}{
		{"every member the bucket carries", bucket(1000), 300, 3, SyncPlan{Send: 3, Budget: bucket(100)}},
		{"the last one overdraws it", bucket(1000), 400, 3, SyncPlan{Send: 3, Budget: bucket(-200)}},
		{"the rest at a later round", bucket(500), 400, 3, SyncPlan{Send: 2, Budget: bucket(-300)}},
		{"none in debt", bucket(0), 10, 3, SyncPlan{Budget: bucket(0)}},
		{"two seconds' worth still goes", bucket(1), 2000, 2, SyncPlan{Send: 1, Budget: bucket(-1999)}},
		{"past two seconds' worth none goes", bucket(1000), 2001, 2, SyncPlan{TooLarge: true, Budget: bucket(1000)}},
		{"no members", bucket(1000), 10, 0, SyncPlan{Budget: bucket(1000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PlanSync(tc.b, tc.cost, tc.n); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("PlanSync(%v, %d, %d) = %+v, want %+v", tc.b.Tokens, tc.cost, tc.n, got, tc.want)
			}
		})
	}
}
